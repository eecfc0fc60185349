"""A ``perfhooks.profile`` loop that sends itself SIGTERM from inside one of perfhooks' own lock-holding regions,
with a capture window open; run by tests/test_signal_regions.py.

    python tests/scripts/signal_inside.py REGION PERF OUTPUT_DIR

REGION: where the signal is sent from, at step 12 or later (each holds the lock named):

- ``writer_put``: the writer's ``submit``, inside ``Queue._put`` (the queue's mutex);
- ``fault_log``: the fault log's ``report`` (its lock);
- ``window_record``: a window's end, adding its record (the windows' lock);
- ``window_stop``: a window's end, inside ``profiler.stop()``;
- ``user_code``: the user's own forward (no lock of perfhooks' held): the control.

PERF: ``1`` profiles, ``0`` runs the same loop bare (and sends the signal at the same step from its own code).
The script prints ``step N`` after each step and never ends on its own before the signal.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import time
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS)]

import torch  # noqa: E402

import perfhooks  # noqa: E402

#: The step from which the signal is sent (windows record steps 4-7, 10-13, ...; one stops at steps 8, 14, ...).
SEND_FROM = 12
SCHEDULE = perfhooks.Schedule(skip_first=2, wait=1, warmup=1, active=4, repeat=0)
STEPS = 2000
state = {"step": 0, "sent": False}


def send() -> None:
    """SIGTERM to this process, once, from the calling frame: the handler runs before the next bytecode here."""
    if state["sent"] or state["step"] < SEND_FROM:
        return
    state["sent"] = True
    print(f"sending at step {state['step']}", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)  # the handler runs here, still inside the region


def arm(region: str, run: Any) -> None:
    engine = run.engine
    if region == "writer_put":
        put = queue.Queue._put

        def _put(self: queue.Queue[Any], item: Any) -> None:
            put(self, item)
            send()

        queue.Queue._put = _put  # type: ignore[method-assign]
    elif region == "fault_log":
        class Sending(dict):  # type: ignore[type-arg]
            def get(self, *args: Any) -> Any:
                send()  # inside `with self._lock`
                return super().get(*args)

        engine.faults._faults = Sending(engine.faults._faults)
    elif region == "window_record":
        class SendingList(list):  # type: ignore[type-arg]
            def append(self, item: Any) -> None:
                super().append(item)
                send()  # inside `with self._lock` of _on_trace_ready

        windows = engine.capture.windows
        windows.windows = SendingList(windows.windows)
    elif region == "window_stop":
        from torch.profiler import profile

        stop = profile.stop

        def stop_sending(self: Any) -> None:
            send()
            stop(self)

        profile.stop = stop_sending  # type: ignore[method-assign]


def main() -> None:
    region, perf, output_dir = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    run = perfhooks.profile(model, optimizer, output_dir=output_dir, schedule=SCHEDULE, console=False,
                            report_every_s=0.05) if perf else None
    if run is not None:
        arm(region, run)
    for step in range(STEPS):
        state["step"] = step + 1
        time.sleep(0.005)
        if region == "user_code" or not perf:
            send()
        elif region == "fault_log" and step + 1 >= SEND_FROM:
            run.engine.faults.report("test_fault", "a fault the test raised")
        model(torch.randn(16, 32)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step + 1}", flush=True)
    if run is not None:
        run.close()
    print("ran to the end", flush=True)


if __name__ == "__main__":
    main()
