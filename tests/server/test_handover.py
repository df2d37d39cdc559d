"""The worker -> loop hand-over (outbox.py), pushed streams (sse.SSEResponse with a sender that
never waits) and text frames from a template (sse.TextFrames): order kept, wake-ups shared,
nothing lost, reordered or serialized differently."""
from __future__ import annotations

import asyncio
import threading

import pytest

from muser.server.outbox import Outbox
from hypothesis import given, settings
from hypothesis import strategies as st

from muser.server import bodies, schemas
from muser.server.sse import TextFrames, frame


def test_posts_from_a_thread_arrive_in_order_on_fewer_wakeups():
    async def main():
        loop = asyncio.get_running_loop()
        box, got, wakes = Outbox(loop), [], []
        deliver = box._deliver

        def counted():
            wakes.append(1)
            deliver()
        box._deliver = counted
        done = threading.Event()

        def worker():
            for i in range(2000):
                box.post(got.append, i)
            box.post(lambda _: done.set(), None)
        t = threading.Thread(target=worker)
        t.start()
        while not done.is_set():
            await asyncio.sleep(0.001)
        t.join()
        return got, len(wakes)
    got, wakes = asyncio.run(main())
    assert got == list(range(2000))
    assert 1 <= wakes < 2001          # posts made while a delivery was pending shared it


def test_a_release_posted_before_done_runs_before_the_done_event():
    """The scheduler frees the slot, then emits "done": the loop must see them in that order."""
    async def main():
        box, seen = Outbox(asyncio.get_running_loop()), []
        q: asyncio.Queue = asyncio.Queue()
        box.post(lambda slot: seen.append(("release", slot)), 3)
        box.post(q.put_nowait, ("done", ["stop"], 5))
        ev = await q.get()
        seen.append(ev[0])
        return seen
    assert asyncio.run(main()) == [("release", 3), "done"]


def test_a_post_after_the_loop_closed_is_dropped_quietly():
    loop = asyncio.new_event_loop()
    box = Outbox(loop)
    loop.close()
    box.post(print, "never")          # no RuntimeError reaches the worker
    box.post(print, "never")          # and the box is not stuck pending
    assert not box._items and not box._pending


@settings(max_examples=200, deadline=None)
@given(text=st.text(), index=st.integers(0, 3), chat=st.booleans())
def test_a_text_frame_from_its_template_is_the_chunk_dumped_whole(text, index, chat):
    """sse.TextFrames: prefix + the text's JSON + suffix == the whole chunk's frame, for any
    text (quotes, backslashes, control characters, astral characters, the marker's own bytes)."""
    def make(t):
        return (bodies.chat_chunk("chatcmpl-x", "m", {"content": t}, None, index=index, created=7)
                if chat else bodies.completion_chunk("cmpl-x", "m", t, None, index=index, created=7))
    assert TextFrames(make)(text) == frame(make(text))


def test_a_template_must_hold_its_text_exactly_once():
    with pytest.raises(ValueError, match="exactly once"):
        TextFrames(lambda t: {"a": "fixed"})
    with pytest.raises(ValueError, match="exactly once"):
        TextFrames(lambda t: {"a": t, "b": t})


def test_a_failing_call_does_not_drop_the_calls_posted_after_it():
    async def main():
        loop = asyncio.get_running_loop()
        errors = []
        loop.set_exception_handler(lambda _, ctx: errors.append(ctx["exception"]))
        box, q = Outbox(loop), asyncio.Queue()
        box.post(lambda _: 1 / 0, None)
        box.post(q.put_nowait, ("done", ["stop"], 1))
        return await q.get(), errors
    ev, errors = asyncio.run(main())
    assert ev[0] == "done" and len(errors) == 1 and isinstance(errors[0], ZeroDivisionError)


def _streamed(events: list, pushed: bool, early: int = 0) -> tuple[list, list]:
    """The body messages an SSEResponse sends for `events` (a chat stream, n = 1, the Formatter
    of the server), pushed (a scope with "muser.post": the --front-process engine side) or
    through the queue and the stream's task, each event taken before the next arrives; `early`
    events are emitted before the response starts (queued, then drained by subscribe)."""
    from types import SimpleNamespace

    from muser.server.job import Job
    from muser.server.metrics import Metrics
    from muser.server.responses import Formatter
    from muser.server.sse import SSEResponse

    async def main():
        loop = asyncio.get_running_loop()
        state = SimpleNamespace(model_id="m", metrics=Metrics(), base_model_note=None,
                                config=SimpleNamespace(replica=None), token_text=None)
        req = schemas.ChatCompletionRequest(model="m", stream=True,
                                            messages=[{"role": "user", "content": "hi"}])
        job = Job(None, SimpleNamespace(n=1), 8, [], Outbox(loop))
        fmt = Formatter(state, req, True, 0.0)
        fmt.rid, fmt.created = "chatcmpl-x", 1
        sent, finals = [], []

        async def send(message):
            sent.append(message)

        async def receive():
            await asyncio.Event().wait()
        scope = {"type": "http"}
        if pushed:
            scope["extensions"] = {"muser.post": sent.append}
        for ev in events[:early]:
            job._deliver(ev)
        resp = SSEResponse(fmt.stream(job), lambda: finals.append(1), push=(job, fmt.shaper(job)))
        task = asyncio.create_task(resp(scope, receive, send))
        for ev in events[early:]:
            for _ in range(5):
                await asyncio.sleep(0)
            job._deliver(ev)
        await asyncio.wait_for(task, 5)
        return sent, finals
    return asyncio.run(main())


EVENTS = [("delta", 0, "Hel", []), ("delta", 0, "lo", []), ("delta", 0, "", []),
          ("delta", 0, " sea", []), ("end", 0, "stop"), ("done", ["stop"], 4)]


@pytest.mark.parametrize("early", [0, 2, 6])
def test_a_pushed_stream_sends_what_the_queued_stream_sends(early):
    queued, done_q = _streamed(EVENTS, pushed=False)
    pushed, done_p = _streamed(EVENTS, pushed=True, early=early)
    assert pushed == queued and done_q == done_p == [1]
    assert queued[-1] == {"type": "http.response.body", "body": b"data: [DONE]\n\n",
                          "more_body": False}
    assert len(queued) == 1 + 1 + 3 + 1 + 1      # start, role chunk, 3 texts, finish, [DONE]


def test_a_pushed_stream_ignores_events_after_its_end():
    pushed, _ = _streamed(EVENTS + [("delta", 0, "late", [])], pushed=True)
    assert pushed == _streamed(EVENTS, pushed=True)[0]
