"""What the tests and the benchmarks (bench/) share: one place, imported by both.

    peer          an aiortc caller (offer, Opus out, audio and events back)
    processes     a gateway process started, waited for and stopped
    redis_server  a throwaway redis-server
    signals       test audio: chirps, voiced speech, resampling, WAV files
    ports         a free local port
    browser       headless Chromium's flags for a fake microphone
    metrics       one /metrics scrape as {sample: value}
    memory        a process's resident memory (RSS)
    sipp          SIPp callers for the SIP bridge
    fuzz_targets  the gateway's input parsers as bytes-in fuzz targets, with valid seeds

Tests never import bench/ (tests/test_layout.py); bench/ imports only this kit from tests/.
"""
