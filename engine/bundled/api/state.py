"""What the routes share: the engine's state as the server knows it, from listening to ready."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prebake.engine.bundled.api.chat import ChatTemplate
from prebake.engine.bundled.api.errors import ApiError
from prebake.engine.bundled.api.fields import UnknownFields
from prebake.engine.bundled.runtime.metrics import Metrics
from prebake.engine.bundled.runtime.tokenizer import Tokenizer

if TYPE_CHECKING:  # torch: loaded once the engine has started, after the server listens
    from prebake.engine.bundled.runtime.scheduler import Scheduler


@dataclass(frozen=True)
class Serving:
    """What the routes need once the engine is ready."""

    scheduler: Scheduler
    tokenizer: Tokenizer | None
    chat: ChatTemplate | None
    eos: frozenset[int]
    target: str
    max_model_len: int
    created: int


@dataclass
class AppState:
    model_id: str
    metrics: Metrics
    step: str = "starting"
    serving: Serving | None = None
    alive: Callable[[], bool] = field(default=lambda: True)  # False once the serving loop has died
    stopping: str | None = None  # why the server is going (at --tp N: a rank died); /health says 503
    unknown_fields: UnknownFields = field(default_factory=UnknownFields)  # ignored and said, or refused
    in_flight: int = 0  # completion requests being answered (/load's server_load; the event loop's only)

    def stop_because(self, reason: str) -> None:
        self.stopping = reason

    def ready(self) -> Serving:
        if self.serving is None:
            raise ApiError(503, f"the engine is starting ({self.step}); poll /health until it says 200")
        return self.serving

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_id:
            raise ApiError(404, f"model {model!r} is not served here; this server serves {self.model_id!r}", "model")
