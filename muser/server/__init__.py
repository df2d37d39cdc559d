"""muser.server: the OpenAI-compatible HTTP server (`muser serve`).

Package map (each module's docstring says what it owns and what it doesn't):
  policy.py       PURE context policy: chat turn split, shift plans, lineage (no torch);
                  raw_policy.py the same for raw prompts (completions)
  schemas.py      strict OpenAI request models;  bodies.py  the JSON bodies sent back
  http_errors.py  server errors and the map from muser's typed errors to HTTP
  slots.py        SlotPool: slots + hidden staging, placement, bounded queue, health latch
  scheduler.py    the worker thread: its loop, prefill/decode time share, failure containment;
                  prefill_rounds.py (admission, shift rebuild, prefill) and decode_rounds.py
                  (token choice, stops, batched decode, speculation) are its methods;
                  job.py a request as the worker sees it, and its events; outbox.py
                  the worker's one road to the event loop (events, slot release, in order)
  prefix.py       the prefix cache over muser.store (cut points, boundaries, admission)
  channels.py     a harmony reply's channels: reasoning apart, function calls as tool calls
  text.py         shared tokenizer proxy (no lock), size bounds, base-model note, stop-aware deltas
  admission.py    message cap, system-only chats, refusing prompts too long by size alone
  sampler.py      request-safe sampling: temperature / top_p floors, non-finite logits
  transport.py    bounded bodies, request-head timeout guard, client aborts, uvicorn config
  front.py        --front-process: the HTTP process (uvicorn, no torch), forwarding to the app;
                  bridge.py the wire and the app's end (requests' receive / send over a socketpair)
  candidates.py   a prompt -> per-slot candidates: the context plan (fresh or a slot's lineage), cuts
  service.py      one request: gates -> candidates -> lease -> job; controls.py: a request's
                  decoding controls; responses.py: JSON / SSE shaping (stream_shape.py: a
                  stream's events -> chunks); sse.py: the SSE response, frames from a template
  tokenize_api.py POST /tokenize and /detokenize (the count the generation endpoints bill)
  persist.py      slot save / restore (packs with the replay plan sealed inside) in --session-dir
  metrics.py      Prometheus text;  config.py  ServerConfig;  app.py  create_app
  (the `muser serve` command is muser/cli/serve.py)
Importing this package imports nothing heavy: `from muser.server.app import create_app`.
"""
