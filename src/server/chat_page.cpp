// The chat page kiln serve answers at /: one self-contained HTML file (no build step, nothing fetched from
// elsewhere) that talks to /v1/chat/completions with streaming, and can stop a reply, start a new
// conversation and set the sampling parameters.
#include "server/api.h"

namespace kiln::server {

const std::string& chat_page() {
  static const std::string page = R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kiln</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 0; display: flex; flex-direction: column; height: 100vh; }
  header { padding: 8px 16px; background: #222; color: #eee; display: flex; gap: 16px; align-items: center;
           flex-wrap: wrap; font-size: 14px; }
  header input { width: 64px; }
  #log { flex: 1; overflow-y: auto; padding: 16px; }
  .msg { white-space: pre-wrap; margin: 8px 0; padding: 8px 12px; border-radius: 8px; max-width: 80ch; }
  .user { background: #dbeafe; margin-left: auto; }
  .assistant { background: #f3f4f6; }
  .error { background: #fee2e2; }
  form { display: flex; gap: 8px; padding: 12px 16px; border-top: 1px solid #ddd; }
  textarea { flex: 1; height: 3em; font: inherit; }
</style>
</head>
<body>
<header>
  <strong>kiln</strong><span id="model"></span>
  <label>temperature <input id="temperature" type="number" value="0.7" min="0" max="2" step="0.1"></label>
  <label>top_p <input id="top_p" type="number" value="0.95" min="0" max="1" step="0.05"></label>
  <label>max tokens <input id="max_tokens" type="number" value="256" min="1" step="1"></label>
  <label>system <input id="system" type="text" placeholder="(none)" style="width: 200px"></label>
  <button id="new" type="button">New conversation</button>
</header>
<div id="log"></div>
<form id="form">
  <textarea id="input" placeholder="Message (Enter sends, Shift+Enter for a new line)"></textarea>
  <button id="send" type="submit">Send</button>
  <button id="stop" type="button" disabled>Stop</button>
</form>
<script>
const log = document.getElementById('log'), input = document.getElementById('input');
const sendButton = document.getElementById('send'), stopButton = document.getElementById('stop');
let history = [], controller = null;
fetch('/v1/models').then(r => r.json()).then(j => {
  document.getElementById('model').textContent = j.data[0].id;
}).catch(() => {});
function add(role, text) {
  const div = document.createElement('div');
  div.className = 'msg ' + role;
  div.textContent = text;
  log.appendChild(div);
  log.scrollTop = log.scrollHeight;
  return div;
}
function num(id) { return Number(document.getElementById(id).value); }
async function send(text) {
  history.push({role: 'user', content: text});
  add('user', text);
  const out = add('assistant', '');
  const system = document.getElementById('system').value;
  const messages = (system ? [{role: 'system', content: system}] : []).concat(history);
  controller = new AbortController();
  sendButton.disabled = true;
  stopButton.disabled = false;
  let reply = '';
  try {
    const r = await fetch('/v1/chat/completions', {
      method: 'POST', headers: {'Content-Type': 'application/json'}, signal: controller.signal,
      body: JSON.stringify({messages, stream: true, temperature: num('temperature'), top_p: num('top_p'),
                            max_tokens: num('max_tokens')})});
    if (!r.ok) throw new Error((await r.json()).error.message);
    const reader = r.body.getReader(), decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let at;
      while ((at = buffer.indexOf('\n\n')) >= 0) {
        const event = buffer.slice(0, at);
        buffer = buffer.slice(at + 2);
        if (!event.startsWith('data: ')) continue;
        const data = event.slice(6);
        if (data === '[DONE]') continue;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        for (const c of j.choices) {
          if (c.delta && c.delta.content) {
            reply += c.delta.content;
            out.textContent = reply;
            log.scrollTop = log.scrollHeight;
          }
        }
      }
    }
  } catch (e) {
    if (e.name !== 'AbortError') {
      out.className = 'msg error';
      out.textContent = reply + (reply ? '\n' : '') + 'Error: ' + e.message;
    }
  }
  history.push({role: 'assistant', content: reply});
  controller = null;
  sendButton.disabled = false;
  stopButton.disabled = true;
}
document.getElementById('form').addEventListener('submit', e => {
  e.preventDefault();
  const text = input.value.trim();
  if (!text || controller) return;
  input.value = '';
  send(text);
});
input.addEventListener('keydown', e => {
  if (e.key === 'Enter' && !e.shiftKey) {
    e.preventDefault();
    document.getElementById('form').requestSubmit();
  }
});
stopButton.addEventListener('click', () => { if (controller) controller.abort(); });
document.getElementById('new').addEventListener('click', () => {
  if (controller) controller.abort();
  history = [];
  log.textContent = '';
});
</script>
</body>
</html>
)html";
  return page;
}

}  // namespace kiln::server
