"""When a flow's task is worth another try: the flaky kind of failure (a disk, a busy store, the broker), never bad
data, which fails the same way every time.

>>> from prefect.states import Failed
>>> condition = retry_on(OSError)
>>> condition(None, None, Failed(data=OSError("disk went away"))), condition(None, None, Failed(data=ValueError("x")))
(True, False)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kafka.errors import KafkaError
from prefect.states import State

from precursor.store import StoreBusy

BROKER_TROUBLE: tuple[type[BaseException], ...] = (KafkaError, ConnectionError, TimeoutError)
STORE_TROUBLE: tuple[type[BaseException], ...] = (StoreBusy, OSError)


def retry_on(*kinds: type[BaseException]) -> Callable[[Any, Any, State], bool]:
    """A Prefect ``retry_condition_fn``: retry when the task failed with one of ``kinds``."""

    def condition(task: Any, task_run: Any, state: State) -> bool:
        try:
            state.result()
        except kinds:
            return True
        except Exception:
            return False
        return False

    return condition
