// A small HTTP/1.1 server on Boost.Beast/Asio for kiln serve: keep-alive, bodies up to a limit (413 past it),
// complete responses or chunked streams (Server-Sent Events), and a disconnect signal while a request is
// being answered, so that generation stops when the client hangs up. A pool of I/O threads runs every
// connection (event-driven: an idle or streaming client holds no thread); each connection's work runs on its
// own strand.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace kiln::server {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query
  std::string query;   // after '?', or empty
  Headers headers;     // as received
  std::string body;
  // The value of header `name` (case-insensitive), or empty.
  std::string_view header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  Headers headers;
  std::string body;
};

// One request's answer. Either respond() once, or begin_stream(), send() any number of chunks, end_stream().
// Every call may come from any thread (token callbacks run on the engine's thread); calls after the exchange
// completed or the client left are ignored.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual void respond(HttpResponse response) = 0;
  virtual void begin_stream(int status, std::string content_type, Headers headers) = 0;
  virtual void send(std::string chunk) = 0;
  virtual void end_stream() = 0;
  // f runs once, on an I/O thread, if the client disconnects before the exchange completes (at once if it has
  // already). Not called after a normal completion.
  virtual void on_disconnect(std::function<void()> f) = 0;
};

using Handler = std::function<void(const HttpRequest&, const std::shared_ptr<Exchange>&)>;

struct HttpOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;  // 0: any free port (HttpServer::port() tells which)
  int io_threads = 2;
  size_t max_body_bytes = size_t{8} << 20;
  // A request must arrive whole within this long (an idle keep-alive connection, or a client sending its
  // header a byte at a time, is closed), and a client must take each piece of an answer within it (one that
  // stops reading is disconnected, which cancels its request).
  std::chrono::seconds timeout{60};
};

class HttpServer {
 public:
  // Binds and listens (errors: an address that does not parse, a port in use; both named). Serves nothing
  // until run().
  static Result<std::unique_ptr<HttpServer>> create(const HttpOptions& options, Handler handler);
  ~HttpServer();
  uint16_t port() const;
  // Runs the I/O threads (this one among them) until stop().
  void run();
  // Closes the listening socket: connections already open are served on.
  void stop_accepting();
  // Stops the I/O threads: open connections are dropped.
  void stop();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::server
