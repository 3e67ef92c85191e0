"""SSE framing of a delta subscription (§16.2)."""

from __future__ import annotations

from datetime import timedelta

from rebuno.kernel.stream.bus import Delta
from rebuno.kernel.stream.memory import MemoryBus
from rebuno.kernel.stream.sse import delta_frame, sse_frames


def test_delta_frame_is_one_compact_json_data_line() -> None:
    frame = delta_frame(Delta(step_id="ab12", seq=3, data='é "q"\n'))
    assert frame == b'data: {"step_id":"ab12","seq":3,"data":"\xc3\xa9 \\"q\\"\\n"}\n\n'


async def test_stream_opens_with_ok_comment_then_one_frame_per_delta() -> None:
    bus = MemoryBus()
    async with bus.subscribe("e1") as subscription:
        frames = sse_frames(subscription, keepalive=timedelta(seconds=30))
        first = await anext(frames)
        bus.publish("e1", Delta(step_id="s", seq=0, data="hi"))
        second = await anext(frames)
        await frames.aclose()
    assert first == b": ok\n\n"
    assert second == b'data: {"step_id":"s","seq":0,"data":"hi"}\n\n'


async def test_quiet_stream_sends_keepalive_comments() -> None:
    bus = MemoryBus()
    async with bus.subscribe("e1") as subscription:
        frames = sse_frames(subscription, keepalive=timedelta(milliseconds=10))
        await anext(frames)
        keepalives = [await anext(frames), await anext(frames)]
        bus.publish("e1", Delta(step_id="s", seq=1, data="x"))
        after = await anext(frames)
        await frames.aclose()
    assert keepalives == [b": keep-alive\n\n", b": keep-alive\n\n"]
    assert after.startswith(b"data: ")
