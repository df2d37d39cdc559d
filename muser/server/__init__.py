"""muser.server: the OpenAI-compatible HTTP server (`muser serve`).

Package map (each module's docstring says what it owns and what it doesn't):
  policy.py       PURE context policy: chat turn split, shift plans, lineage (no torch)
  schemas.py      strict OpenAI request models and response shapes
  http_errors.py  server errors and the map from muser's typed errors to HTTP
  slots.py        SlotPool: slots + hidden staging, placement, bounded queue, health latch
  scheduler.py    the worker thread: prefill / shift rebuild / batched decode / sampling
  text.py         locked tokenizer proxy and stop-aware text deltas
  service.py      one request: plan -> lease -> job; responses.py: JSON / SSE shaping
  persist.py      slot save / restore (pack files + replay sidecar) in --session-dir
  metrics.py      Prometheus text;  config.py  ServerConfig;  app.py  create_app
  (the `muser serve` command is muser/cli/serve.py)
Importing this package imports nothing heavy: `from muser.server.app import create_app`.
"""
