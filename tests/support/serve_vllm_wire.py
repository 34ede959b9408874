"""Run the vLLM wire server over the tiny model in its own process: prints its URL, serves
until terminated or until its stdin closes (the test process is gone). For tests that must not
count the server's sockets as their own."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))

from support.vllm_wire_server import VLLMWireServer  # noqa: E402

from harness_gym.engines import load_engine  # noqa: E402


def main() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    engine = load_engine("tiny")
    with VLLMWireServer(engine, logprobs_mode="processed_logprobs") as server:
        print(server.url, flush=True)
        stop.wait()
    engine.close()


if __name__ == "__main__":
    main()
