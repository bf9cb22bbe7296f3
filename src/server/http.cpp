#include "server/http.h"

#include <fmt/format.h>

#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <optional>
#include <thread>

namespace kiln::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

// Beast's string_view is Boost's in Boost 1.74.
std::string_view sv(beast::string_view s) { return {s.data(), s.size()}; }

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

}  // namespace

std::string_view HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (iequal(k, name)) return v;
  }
  return {};
}

namespace {

std::string status_line(int status) {
  return fmt::format("HTTP/1.1 {} {}\r\n", status,
                     sv(http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)))));
}

std::string head(int status, std::string_view content_type, const Headers& extra, bool keep_alive,
                 std::optional<size_t> content_length) {
  std::string h = status_line(status);
  h += fmt::format("Server: kiln\r\nContent-Type: {}\r\n", content_type);
  h += content_length ? fmt::format("Content-Length: {}\r\n", *content_length)
                      : std::string("Transfer-Encoding: chunked\r\n");
  h += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const auto& [k, v] : extra) h += fmt::format("{}: {}\r\n", k, v);
  h += "\r\n";
  return h;
}

std::string error_body(std::string_view message, std::string_view type) {
  // The OpenAI error shape, for the errors the HTTP layer itself answers (the message has no quotes).
  return fmt::format(R"({{"error":{{"message":"{}","type":"{}","param":null,"code":null}}}})", message, type);
}

class Session;

// The Exchange of one request on a session: a handle the handler may keep after the session moved on to the
// next request or closed; `seq` tells which request it answers.
class SessionExchange final : public Exchange {
 public:
  SessionExchange(std::weak_ptr<Session> session, uint64_t seq) : session_(std::move(session)), seq_(seq) {}
  void respond(HttpResponse response) override;
  void begin_stream(int status, std::string content_type, Headers headers) override;
  void send(std::string chunk) override;
  void end_stream() override;
  void on_disconnect(std::function<void()> f) override;

 private:
  std::weak_ptr<Session> session_;
  uint64_t seq_;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const HttpOptions& options, const Handler& handler)
      : stream_(std::move(socket)), options_(options), handler_(handler) {}

  void start() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

  // The Exchange calls, posted onto the session's strand.
  template <class F>
  void post(uint64_t seq, F f) {
    asio::post(stream_.get_executor(), [self = shared_from_this(), seq, f = std::move(f)]() mutable {
      if (seq == self->seq_ && self->answering_) f(*self);
    });
  }
  void respond(HttpResponse r) {
    if (streaming_) return;
    HttpResponse& res = r;
    enqueue(head(res.status, res.content_type, res.headers, keep_alive_, res.body.size()) + res.body);
    complete();
  }
  void begin_stream(int status, const std::string& content_type, const Headers& headers) {
    if (streaming_) return;
    streaming_ = true;
    enqueue(head(status, content_type, headers, keep_alive_, std::nullopt));
  }
  void send_chunk(const std::string& data) {
    if (!streaming_ || data.empty()) return;
    enqueue(fmt::format("{:x}\r\n", data.size()) + data + "\r\n");
  }
  void end_stream() {
    if (!streaming_) return;
    enqueue("0\r\n\r\n");
    complete();
  }
  void set_on_disconnect(std::function<void()> f) {
    if (client_gone_) {
      f();
      return;
    }
    on_disconnect_ = std::move(f);
  }

 private:
  void read_request() {
    parser_.emplace();
    parser_->body_limit(options_.max_body_bytes);
    parser_->header_limit(64 * 1024);
    stream_.expires_after(options_.timeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
        ec == asio::error::eof) {
      return close();
    }
    keep_alive_ = false;
    if (ec == http::error::body_limit) {
      const std::string body =
          error_body(fmt::format("the request body is over the limit of {} bytes", options_.max_body_bytes),
                     "invalid_request_error");
      answering_ = true;
      return respond({413, "application/json", {}, body});
    }
    if (ec) {
      answering_ = true;
      return respond(
          {400, "application/json", {}, error_body("malformed HTTP request", "invalid_request_error")});
    }
    const auto& req = parser_->get();
    keep_alive_ = req.keep_alive();
    HttpRequest r;
    r.method = std::string(sv(req.method_string()));
    const std::string_view target = sv(req.target());
    const size_t q = target.find('?');
    r.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) r.query = std::string(target.substr(q + 1));
    for (const auto& f : req)
      r.headers.emplace_back(std::string(sv(f.name_string())), std::string(sv(f.value())));
    r.body = std::move(parser_->get().body());
    // What the request arrived in is let go before it is answered: a queued request holds its header fields
    // and read buffer (up to --max-body and 64 KiB of header) no longer than its handler runs.
    parser_.reset();
    buffer_.shrink_to_fit();  // bytes a client pipelined are kept
    ++seq_;
    answering_ = true;
    streaming_ = false;
    on_disconnect_ = nullptr;
    stream_.expires_never();  // a long generation is not a timeout; the watch below sees a hang-up
    watch();
    auto ex = std::make_shared<SessionExchange>(weak_from_this(), seq_);
    handler_(r, ex);
  }

  // While a request is being answered, a wait for the socket to become readable: a client that closed or
  // reset the connection makes it readable with nothing (or an error) to read. Bytes a client pipelines
  // meanwhile are kept for the next request. A readiness report can be stale by the time the handler runs
  // (an earlier read took the bytes), so the read here never blocks: with nothing to read, the watch goes on.
  // A blocking read there once held an I/O thread, and every connection on it, until the client gave up.
  void watch() {
    const uint64_t gen = ++watch_gen_;
    stream_.socket().async_wait(
        tcp::socket::wait_read, [self = shared_from_this(), gen](beast::error_code ec) {
          if (gen != self->watch_gen_ || !self->answering_ || ec == asio::error::operation_aborted) return;
          if (!ec) {
            char tmp[4096];
            beast::error_code rec;
            self->stream_.socket().non_blocking(true, rec);
            const size_t n = rec ? 0 : self->stream_.socket().read_some(asio::buffer(tmp), rec);
            if (rec == asio::error::would_block || rec == asio::error::try_again) return self->watch();
            if (!rec && n > 0) {
              if (self->buffer_.size() + n <= self->options_.max_body_bytes + 65536) {
                const auto dst = self->buffer_.prepare(n);
                asio::buffer_copy(dst, asio::buffer(tmp, n));
                self->buffer_.commit(n);
                return self->watch();
              }
            }
          }
          self->client_left();
        });
  }

  void client_left() {
    if (client_gone_) return;
    client_gone_ = true;
    if (answering_ && on_disconnect_) {
      auto f = std::move(on_disconnect_);
      on_disconnect_ = nullptr;
      f();
    }
    close();
  }

  void complete() {
    answering_ = false;
    on_disconnect_ = nullptr;
    ++watch_gen_;  // the pending watch, if any, is stale: it returns when it fires, reading nothing
    closing_after_write_ = !keep_alive_;
  }

  void enqueue(std::string bytes) {
    out_.push_back(std::move(bytes));
    if (!writing_) {
      writing_ = true;
      write_next();
    }
  }

  void write_next() {
    if (out_.empty()) {
      writing_ = false;
      if (answering_) return;  // more of a stream to come
      if (closing_after_write_ || client_gone_) return close();
      return read_request();
    }
    stream_.expires_after(options_.timeout);  // a client that stops reading is let go
    asio::async_write(stream_, asio::buffer(out_.front()),
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        self->stream_.expires_never();
                        self->out_.pop_front();
                        if (ec) {
                          self->writing_ = false;
                          return self->client_left();
                        }
                        self->write_next();
                      });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  beast::tcp_stream stream_;
  const HttpOptions& options_;
  const Handler& handler_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<std::string> out_;
  std::function<void()> on_disconnect_;
  uint64_t seq_ = 0, watch_gen_ = 0;
  bool keep_alive_ = true, answering_ = false, streaming_ = false, writing_ = false;
  bool closing_after_write_ = false, client_gone_ = false, closed_ = false;
};

void SessionExchange::respond(HttpResponse response) {
  if (auto s = session_.lock())
    s->post(seq_, [r = std::move(response)](Session& x) mutable { x.respond(std::move(r)); });
}
void SessionExchange::begin_stream(int status, std::string content_type, Headers headers) {
  if (auto s = session_.lock()) {
    s->post(seq_, [status, c = std::move(content_type), h = std::move(headers)](Session& x) {
      x.begin_stream(status, c, h);
    });
  }
}
void SessionExchange::send(std::string chunk) {
  if (auto s = session_.lock()) s->post(seq_, [c = std::move(chunk)](Session& x) { x.send_chunk(c); });
}
void SessionExchange::end_stream() {
  if (auto s = session_.lock()) s->post(seq_, [](Session& x) { x.end_stream(); });
}
void SessionExchange::on_disconnect(std::function<void()> f) {
  if (auto s = session_.lock()) {
    s->post(seq_, [f = std::move(f)](Session& x) mutable { x.set_on_disconnect(std::move(f)); });
  } else if (f) {
    f();  // the connection is gone already
  }
}

}  // namespace

struct HttpServer::Impl {
  HttpOptions options;
  Handler handler;
  asio::io_context ioc;
  tcp::acceptor acceptor{ioc};
  uint16_t port = 0;

  void accept() {
    acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
      if (!ec) {
        // A small send buffer bounds what a client that stops reading holds in the kernel, and lets the write
        // timeout find it after tens of kilobytes rather than megabytes (token streams are small).
        beast::error_code ignored;
        socket.set_option(asio::socket_base::send_buffer_size(32 * 1024), ignored);
        socket.set_option(tcp::no_delay(true), ignored);
        std::make_shared<Session>(std::move(socket), options, handler)->start();
      }
      accept();
    });
  }
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { stop(); }

Result<std::unique_ptr<HttpServer>> HttpServer::create(const HttpOptions& options, Handler handler) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->handler = std::move(handler);
  beast::error_code ec;
  const auto address = asio::ip::make_address(options.host, ec);
  if (ec) return invalid_argument("--host {}: not an IP address ({})", options.host, ec.message());
  const tcp::endpoint endpoint(address, options.port);
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return make_status(StatusCode::io_error, "cannot listen on {}:{}: {}", options.host, options.port,
                       ec.message());
  impl->port = impl->acceptor.local_endpoint().port();
  impl->accept();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

uint16_t HttpServer::port() const { return impl_->port; }

void HttpServer::run() {
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, impl_->options.io_threads); ++i)
    threads.emplace_back([this] { impl_->ioc.run(); });
  impl_->ioc.run();
  for (auto& t : threads) t.join();
}

void HttpServer::stop_accepting() {
  asio::post(impl_->ioc, [this] {
    beast::error_code ignored;
    impl_->acceptor.close(ignored);
  });
}

void HttpServer::stop() { impl_->ioc.stop(); }

}  // namespace kiln::server
