"""POST /refine: the refinement (refine.py) streamed as NDJSON, one line per step, stopped at the
next step once its client has gone.

Both FastAPI services and every Ray Serve replica serve it, through the scheduler of /predict
(predict_api.py hands it over; scheduler.py), so that its bounds hold for a stream as for a
/predict request: the photo is decoded once, with `decode`, once there is room ahead of the predict
slots (DECODE_AHEAD), and it holds that room until its first step is in a slot; each step is one
inference, run with `run_in_slot`, a job in the slots' queue like a /predict request's, its slot
wait timed the same way. Concurrent streams take turns step by step, with /predict requests
between them. The photo is decoded before the stream starts: a body that is not an image is a
400, never a broken stream.

A stream's steps are computed by a task of its own (`Stream.produce`), and the response sends what
it made. How a stream learns that its client has gone:
- under uvicorn, Starlette's StreamingResponse listens for `http.disconnect` and cancels the
  response's iteration, and DisconnectWatch (client_gone.py) hears it too;
- on Ray Serve, the proxy sees the connection close and cancels the handler in the replica, which
  cancels the response's iteration.
Before each step the producer checks whether the client has gone, and stops there: a step already
running in a slot runs to its end (a model call cannot be interrupted), a step still waiting for a
slot leaves the queue. A client gone while its photo waits to be decoded is abandoned there (a
499, the stream counted as stopped). With ABANDON_ON_DISCONNECT=off the producer computes every
step anyway, for nobody: the lab's experiment (notebook 10).

/metrics counts the steps computed, those that finished after their client had gone, the streams
by how they ended, and the streams running now (predict_metrics.py); and, as for /predict, the
photo's decoding and each step's slot wait and inference.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from functools import partial
from http import HTTPStatus

from fastapi import FastAPI, HTTPException, Request, status
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field, field_validator
from pydantic.json_schema import JsonDict

from food11 import (
    BASE64_PATTERN,
    DEFAULT_STEPS,
    MAX_STEPS,
    InvalidImageError,
    RunningMean,
    Views,
    checked_steps,
    decode_base64_image,
)
from servelab.service.client_gone import CLIENT_CLOSED_REQUEST, ClientGone, DisconnectWatch
from servelab.service.predict_metrics import PredictMetrics
from servelab.service.scheduler import Decoded, InferenceFailed, Scheduler

log = logging.getLogger("food11.service")
NDJSON = "application/x-ndjson"
# How the request schemas of POST /predict and POST /refine state an image field: what food11.decode_base64 takes.
IMAGE_SCHEMA: JsonDict = {"contentEncoding": "base64", "pattern": BASE64_PATTERN}
# The event loop keeps only weak references to tasks: a producer whose response has gone (with
# abandoning off) is kept here until it ends.
_producers: set[asyncio.Task] = set()


class RefineRequest(BaseModel):
    image: str = Field(
        ..., min_length=1, description="A JPEG or PNG file, base64-encoded.", json_schema_extra=IMAGE_SCHEMA
    )
    steps: int = Field(
        DEFAULT_STEPS,
        description=f"Views to classify, from 1 to {MAX_STEPS}: one inference each.",
        json_schema_extra={"minimum": 1, "maximum": MAX_STEPS},
    )

    @field_validator("steps", mode="before")
    @classmethod
    def from_one_to_max(cls, steps: object) -> int:
        return checked_steps(steps)


def _line(fields: dict) -> bytes:
    return json.dumps(fields).encode() + b"\n"


class Stream:
    """One /refine stream: `produce` computes its steps in the predict slots and queues one line
    per step; `lines` is what the response sends."""

    def __init__(
        self,
        photo: Decoded[Views],
        steps: int,
        watch: DisconnectWatch,
        scheduler: Scheduler,
        metrics: PredictMetrics,
    ) -> None:
        self.photo, self.steps, self.watch = photo, steps, watch
        self.scheduler, self.metrics = scheduler, metrics
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()  # None: no more lines
        self.producer = asyncio.create_task(self.produce())
        _producers.add(self.producer)
        self.producer.add_done_callback(_producers.discard)
        # A stream that ended before its first step's slot took the photo (even one cancelled
        # before it began) gives the photo's room back here; otherwise that slot has.
        self.producer.add_done_callback(lambda _: scheduler.give_room_back(photo))

    def counted(self) -> None:
        """A step computed, in its slot once the model has answered: counted even if the stream
        stops before it reads the answer."""
        self.metrics.refine_steps_computed.inc()
        if self.watch.gone.is_set():
            self.metrics.refine_steps_for_gone_clients.inc()

    async def produce(self) -> None:
        outcome = "completed"
        self.metrics.refine_running.inc()
        answer = RunningMean()
        try:
            for number in range(1, self.steps + 1):
                self.watch.check("before_inference")  # between two steps: stop once the client has gone
                logits = await self.scheduler.run_in_slot(
                    partial(self.photo.value.batch, number),
                    self.watch,
                    ahead=self.photo if number == 1 else None,  # the first step's slot takes the photo's room
                    answered=self.counted,
                )
                ((label, probability),) = answer.add(logits)
                fields = {"step": number, "steps": self.steps, "prediction": label, "probability": probability}
                self.queue.put_nowait(_line(fields))
        except (ClientGone, asyncio.CancelledError):  # cancelled: by `lines`, once the client has gone
            outcome = "stopped"
        except InferenceFailed as failed:  # the model failed (the scheduler logged it); the 200 went with line one
            outcome = "failed"
            self.queue.put_nowait(_line({"error": str(failed)}))
        except Exception:
            outcome = "failed"
            log.exception("A /refine stream failed")
            self.queue.put_nowait(_line({"error": "the stream failed; the server log says why"}))
        finally:
            self.queue.put_nowait(None)
            self.watch.stop()
            self.metrics.refine_running.dec()
            self.metrics.refine_streams.labels(outcome).inc()

    async def lines(self) -> AsyncIterator[bytes]:
        try:
            while (line := await self.queue.get()) is not None:
                yield line
        finally:
            if not self.producer.done():  # the response ended before the stream did: its client left
                self.watch.client_left()
                if self.watch.abandon:
                    self.producer.cancel()  # a step waiting for a slot leaves the queue


def add_refine_route(app: FastAPI, scheduler: Scheduler, metrics: PredictMetrics, abandon: bool) -> None:
    """POST /refine on `app`: the photo decoded ahead of the scheduler's slots, the steps run in them."""

    async def decoded(image: str, watch: DisconnectWatch) -> Decoded[Views]:
        try:
            return await scheduler.decode(lambda: Views([decode_base64_image(image)]), watch)
        except InvalidImageError as exc:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
        except ClientGone:
            metrics.refine_streams.labels("stopped").inc()
            raise HTTPException(
                CLIENT_CLOSED_REQUEST, "The client disconnected before its stream began; no step was computed."
            ) from None

    @app.post(
        "/refine",
        response_class=StreamingResponse,
        responses={
            status.HTTP_200_OK: {
                "content": {NDJSON: {}},
                "description": 'One JSON line per step: {"step", "steps", "prediction", "probability"}, the '
                'running mean\'s best class so far; a line {"error": ...} if the model failed midway.',
            },
            status.HTTP_400_BAD_REQUEST: {"description": "Not a decodable image"},
            HTTPStatus.UNPROCESSABLE_ENTITY: {"description": f"No image, or steps not from 1 to {MAX_STEPS}"},
            CLIENT_CLOSED_REQUEST: {"description": "The client left before its stream began; nobody reads this"},
        },
    )
    async def refine(request: RefineRequest, connection: Request) -> StreamingResponse:
        """Classify the photo over `steps` views, streaming the answer so far after each one;
        the stream stops at its next step once the client has gone (unless ABANDON_ON_DISCONNECT=off)."""
        # The body has been read: from here on, the connection can only tell that the client left.
        watch = DisconnectWatch(connection.receive, abandon)
        try:
            photo = await decoded(request.image, watch)
        except BaseException:
            watch.stop()  # no stream will stop it
            raise
        stream = Stream(photo, request.steps, watch, scheduler, metrics)
        return StreamingResponse(stream.lines(), media_type=NDJSON)
