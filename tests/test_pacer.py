"""The outbound pacer on a virtual clock: no drift, silence when idle, flush and hold within a frame."""

import random
from fractions import Fraction

import numpy as np

from engine.priority import native_threads
from engine.wavfile import resample
from gateway.conversation import Conversation
from gateway.echo_suppressor import FRAME as SUPPRESSOR_FRAME
from gateway.echo_suppressor import SAMPLE_RATE as SUPPRESSOR_RATE
from gateway.events import EventChannel
from gateway.opus import OpusDecoder
from gateway.pacer import FRAME_SAMPLES, REFERENCE_FRAME, REFERENCE_RATE, REWIND_KEPT_S, SAMPLE_RATE, PacedAudioTrack
from gateway.responders import EchoResponder


class VirtualClock:
    """A clock whose sleeps overshoot like a loaded machine's (0-8 ms late)."""

    def __init__(self, seed: int = 1) -> None:
        self.now = 1000.0
        self.rng = random.Random(seed)
        self.stall_next = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds + self.rng.uniform(0, 0.008) + self.stall_next
        self.stall_next = 0.0


def tone(seconds: float, rate: int, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (8000 * np.sin(2 * np.pi * freq * t)).astype(np.int16)


async def test_frames_follow_the_clock_without_drift():
    clock = VirtualClock()
    pacer = PacedAudioTrack(clock=clock, sleep=clock.sleep)
    start = None
    for k in range(3000):  # one minute
        packet = await pacer.recv()
        start = clock.now if start is None else start
        assert packet.pts == k * FRAME_SAMPLES and packet.time_base == Fraction(1, SAMPLE_RATE)
        # Frame k leaves no earlier than its slot and never more than one oversleep after it:
        # lateness does not accumulate.
        slot = start + k * 0.020
        assert slot - 1e-9 <= clock.now <= slot + 0.0081
    assert pacer.stats.silence_frames == 3000 and pacer.stats.audio_frames == 0
    assert pacer.stats.lateness_ms_p99 <= 8.1


async def test_queued_audio_plays_in_order_then_silence():
    clock = VirtualClock()
    pacer = PacedAudioTrack(clock=clock, sleep=clock.sleep)
    pacer.write(tone(0.5, 16000), 16000)  # 16 kHz in, resampled to 48 kHz
    decoder = OpusDecoder(48000)
    levels = []
    for _ in range(40):
        pcm = decoder.decode(bytes(await pacer.recv()))
        levels.append(float(np.sqrt(np.mean(pcm.astype(np.float32) ** 2))))
    assert min(levels[2:23]) > 2000  # the tone (after the codec's look-ahead)
    assert max(levels[30:]) < 50  # then silence
    assert abs(pacer.stats.audio_samples_sent - 0.5 * SAMPLE_RATE) <= 96  # the resampler keeps < 2 ms
    assert pacer.stats.silence_frames >= 14


async def test_flush_stops_audio_within_one_frame():
    clock = VirtualClock()
    pacer = PacedAudioTrack(clock=clock, sleep=clock.sleep)
    pacer.write(tone(2.0, 24000), 24000)
    for _ in range(10):
        await pacer.recv()
    sent_before = pacer.stats.audio_samples_sent
    dropped = pacer.flush()
    assert dropped > 0 and pacer.queued_ms == 0
    await pacer.recv()  # the very next frame carries none of the flushed audio
    assert pacer.stats.audio_samples_sent == sent_before
    assert pacer.stats.flushes == 1 and pacer.stats.flushed_samples == dropped


async def test_hold_silences_the_next_frame_and_release_plays_on_from_there():
    clock = VirtualClock()
    pacer = PacedAudioTrack(clock=clock, sleep=clock.sleep)
    pacer.write(tone(1.0, 24000), 24000)
    for _ in range(10):
        await pacer.recv()
    sent, queued = pacer.stats.audio_samples_sent, pacer.queued_ms
    pacer.hold()
    for _ in range(5):
        await pacer.recv()  # silence, from the very next frame
    assert pacer.stats.audio_samples_sent == sent and pacer.queued_ms == queued
    assert pacer.stats.silence_frames == 5 and pacer.stats.holds == 1
    pacer.release()
    await pacer.recv()
    assert pacer.stats.audio_samples_sent == sent + FRAME_SAMPLES  # the next piece, nothing skipped


async def test_release_with_a_rewind_sends_the_last_audio_again():
    """What a client cut on the way to the ear is sent again, exactly, and played_samples
    moves back by as much; never more than REWIND_KEPT_S, nothing from before a flush."""
    clock = VirtualClock()
    pacer = PacedAudioTrack(clock=clock, sleep=clock.sleep)
    sent: list[np.ndarray] = []
    references: list[np.ndarray] = []
    pacer.on_sent = lambda frame: (sent.append(frame.audio.copy()), references.append(frame.reference.copy()))
    pacer.write(tone(2.0, 24000), 24000)
    for _ in range(40):
        await pacer.recv()
    played, position = pacer.played_samples, pacer.write_position
    pacer.hold()
    await pacer.recv()
    rewind = 5 * FRAME_SAMPLES + 100
    assert pacer.release(rewind) == rewind
    assert pacer.played_samples == played - rewind and pacer.write_position == position
    for _ in range(6):
        await pacer.recv()
    before = np.concatenate(sent[:40])
    again = np.concatenate(sent[41:47])
    assert np.array_equal(again[:rewind], before[-rewind:]), "the cut audio, sample for sample"
    echo_again, echo_before = rewind // 3, np.concatenate(references[:40])
    assert np.array_equal(np.concatenate(references[41:47])[:echo_again], echo_before[-echo_again:]), \
        "and its echo reference with it"

    pacer.hold()
    kept = pacer.release(10 * SAMPLE_RATE)
    assert REWIND_KEPT_S * SAMPLE_RATE <= kept < REWIND_KEPT_S * SAMPLE_RATE + FRAME_SAMPLES, "bounded by what is kept"
    pacer.flush()
    pacer.write(tone(0.5, 24000), 24000)
    await pacer.recv()
    pacer.hold()
    assert pacer.release(10 * SAMPLE_RATE) == FRAME_SAMPLES, "nothing from before the flush"


async def test_the_echo_reference_is_the_tts_audio_resampled_once_and_leaves_with_its_frame():
    """What the echo suppressor gets for 22.05 kHz TTS audio is that audio resampled once to
    16 kHz (band-limited, as engine.wavfile.resample does it offline), sample for sample, and
    frame for frame with what is sent: a hold's frames are silent, playing on continues where
    it stopped, nothing flushed arrives. (A copy of the 48 kHz frames averaged three samples at
    a time misses by thousands: it lags by a 48 kHz sample and folds 10 kHz down to 6 kHz.)"""
    assert REFERENCE_RATE == SUPPRESSOR_RATE and REFERENCE_FRAME == SUPPRESSOR_FRAME
    clock = VirtualClock()
    pacer = PacedAudioTrack(clock=clock, sleep=clock.sleep)
    conversation = Conversation(None, lambda: None, EchoResponder(), pacer, EventChannel())
    tts_rate = 22050
    t = np.arange(tts_rate) / tts_rate
    voice = (6000 * np.sin(2 * np.pi * 1000 * t) + 3000 * np.sin(2 * np.pi * 10000 * t)).astype(np.int16)
    for start in range(0, len(voice), tts_rate // 10):  # 100 ms pieces, as a TTS stream gives them
        pacer.write(voice[start:start + tts_rate // 10], tts_rate)
    heard_by_suppressor = []
    for k in range(60):
        if k == 20:
            pacer.hold()
        elif k == 25:
            pacer.release()
        elif k == 40:
            pacer.flush()
        await pacer.recv()
        conversation.echo.process(np.zeros(SUPPRESSOR_FRAME, np.int16))  # the inbound frame of that moment
        heard_by_suppressor.append(conversation.echo.last_reference.copy())

    played = np.concatenate(heard_by_suppressor[:20] + heard_by_suppressor[25:40]).astype(np.float64)
    expected = resample(voice / 32768, tts_rate, REFERENCE_RATE)[:len(played)] * 32768
    assert len(played) == 35 * REFERENCE_FRAME
    assert np.max(np.abs(played - expected)) <= 2, "the TTS audio at 16 kHz, sample for sample"
    silent = heard_by_suppressor[20:25] + heard_by_suppressor[40:]
    assert not any(frame.any() for frame in silent), "held and flushed frames carry no reference"


async def test_a_stalled_loop_restarts_the_clock_instead_of_bursting():
    clock = VirtualClock()
    pacer = PacedAudioTrack(clock=clock, sleep=clock.sleep)
    for _ in range(10):
        await pacer.recv()
    clock.stall_next = 2.0  # the event loop was blocked for two seconds
    await pacer.recv()
    assert pacer.stats.clock_resyncs == 1
    before = clock.now
    await pacer.recv()
    assert clock.now - before >= 0.019  # paced again, not a burst of 100 frames


async def test_opus_is_mono_about_32_kbits():
    clock = VirtualClock()
    pacer = PacedAudioTrack(clock=clock, sleep=clock.sleep)
    pacer.write(tone(3.0, 48000, 300.0) + tone(3.0, 48000, 1200.0) // 2, 48000)
    sizes = [len(bytes(await pacer.recv())) for _ in range(150)]
    kbits = np.mean(sizes) * 8 * 50 / 1000
    assert 20 <= kbits <= 40, kbits
    assert not (bytes(await pacer.recv())[0] & 0x04)  # TOC stereo flag clear: mono


async def test_until_played_completes_with_the_frame_that_carries_the_mark():
    clock = VirtualClock()
    pacer = PacedAudioTrack(clock=clock, sleep=clock.sleep)
    pacer.write(np.full(FRAME_SAMPLES * 3, 1000, np.int16), SAMPLE_RATE)
    assert pacer.until_played(0).done(), "a mark playback has reached is done at once"
    end = pacer.until_played(pacer.write_position)
    middle = pacer.until_played(FRAME_SAMPLES + 1)
    await pacer.recv()
    assert not middle.done()
    await pacer.recv()
    assert middle.done() and middle.result() is True and not end.done()
    pacer.hold()
    await pacer.recv()
    assert not end.done(), "a held pacer plays nothing"
    pacer.release()
    await pacer.recv()
    assert end.result() is True


async def test_until_played_says_false_when_a_flush_drops_the_audio():
    clock = VirtualClock()
    pacer = PacedAudioTrack(clock=clock, sleep=clock.sleep)
    pacer.write(np.full(FRAME_SAMPLES * 3, 1000, np.int16), SAMPLE_RATE)
    end = pacer.until_played(pacer.write_position)
    await pacer.recv()
    pacer.flush()
    assert end.done() and end.result() is False
    abandoned = pacer.until_played(pacer.write_position + 1)
    abandoned.cancel()  # a waiter that gave up
    pacer.write(np.full(FRAME_SAMPLES, 1000, np.int16), SAMPLE_RATE)
    await pacer.recv()  # completing the marks skips the cancelled one


def test_a_stopped_pacer_lets_its_resamplers_threads_go():
    # libav's resamplers each hold two threads; a call's must end with the call, not whenever
    # the garbage collector reaches the call's reference cycles
    before = len(native_threads())
    pacer = PacedAudioTrack(clock=VirtualClock())
    keep_alive = [pacer]  # (as a call's other objects would)
    pacer.write(tone(0.5, 22050), 22050)
    assert len(native_threads()) > before
    pacer.stop()
    assert len(native_threads()) == before
    pacer.write(tone(0.5, 22050), 22050)  # a reply's audio that arrives after the call ended
    assert len(native_threads()) == before and keep_alive
