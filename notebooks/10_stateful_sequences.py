# %% [markdown]
# # 10. Stateful inference: sequences and the sequence batcher
#
# **Time:** about 16 minutes (6 reading, 3 running, 6 hands-on; `python -m servelab.time_plan`)
#
# Every model so far answered each request on its own. Some answers depend on what came before:
# a meal filmed as a stream of frames is one dish, and a classifier that sees one frame at a time
# should answer with what the frames **so far** say, not with the last frame's guess. The model
# `food_sequence` does that: each request is one frame of one **sequence** (a correlation ID the
# client chooses), and the answer is the sequence's running label and probabilities. That running
# mean is **state**, and the server has to keep it between requests, per sequence.
#
# TorchServe built this as "stateful inference": a sequence ID on each request, a handler that
# keeps each sequence's state in an LRU cache of bounded capacity, an idle timeout and a total
# timeout per sequence, a bounded job queue per sequence, explicit start, end and cancel, and
# **sequence batching**: one request from each of several sequences combined into one batch.
# TorchServe is no longer maintained; Triton's **sequence batcher** does the same job, and this
# notebook teaches it there.
#
# TorchServe calls its batching here *sequence continuous batching*, and it has two parts. First,
# each batch takes one waiting request from each of several sequences, and batches keep forming
# as sequences start and end, without waiting for a whole batch of sequences to finish: Triton's
# `oldest` strategy does that, and this notebook measures it. Second, a sequence's next request
# may be served while the previous one still streams its answer: in Triton that needs a decoupled
# model and the sequence batcher's `iterative_sequence`, which this notebook does not use (each
# frame here is a request answered once; notebook 9 streams answers from a decoupled model).
#
# How Triton's sequence batcher works:
#
# - each request carries `sequence_id` and the flags `sequence_start` and `sequence_end`. Triton
#   refuses a request for a sequence it does not know unless it starts one;
# - every request of a sequence goes to the same model instance, in order, one at a time;
# - **oldest** strategy: each execution takes the oldest waiting frame of each of up to
#   `max_batch_size` sequences, so frames of different sequences share one forward pass;
# - **direct** strategy: each sequence is pinned to one of `max_batch_size` batch slots; empty
#   slots travel along as requests marked not READY, which the model answers without computing;
# - a Python-backend model gets no state from Triton: `food_sequence/1/model.py` keeps it, keyed
#   by `request.correlation_id()`, in an LRU of `state_capacity` sequences.

# %%
# runs in the Jupyter container (Docker) or on your machine (local)
import time

import matplotlib.pyplot as plt
import tritonclient.grpc as grpcclient
from IPython.display import Markdown, display
from tritonclient.utils import InferenceServerException

from servelab import paths
from servelab.lab import Lab
from servelab.lessons import sequences
from servelab.triton import stats as triton_stats

lab = Lab.connect("10_stateful_sequences")
MODEL = "food_sequence"
print(f"The models run on {lab.hardware()}.")

# %% [markdown]
# ## TorchServe's settings, and where each lives here
#
# The values are read from the configuration the server runs now.

# %%
served = lab.triton.config(MODEL).proto
batcher = served.sequence_batching
strategy = batcher.WhichOneof("strategy_choice")
parameter = {key: value.string_value for key, value in served.parameters.items()}
rows = [
    ("sequence ID (header ts_request_sequence_id)", "the request's sequence_id; request.correlation_id() in model.py",
     "client request", "chosen by the client"),
    ("start / end of a sequence", "the request flags sequence_start / sequence_end; START and END control inputs",
     "client request; config.pbtxt control_input", "per request"),
    ("sequenceMaxIdleMSec", "idle_timeout_s (the model's), backed by max_sequence_idle_microseconds (Triton's)",
     "config.pbtxt parameters; sequence_batching",
     f"{parameter['idle_timeout_s']} s; {batcher.max_sequence_idle_microseconds / 1e6:g} s"),
    ("sequenceTimeoutMSec", "sequence_timeout_s", "config.pbtxt parameters", f"{parameter['sequence_timeout_s']} s"),
    ("cache capacity (the handler's LRU)", "state_capacity", "config.pbtxt parameters",
     f"{parameter['state_capacity']} sequences per instance"),
    ("maxSequenceJobQueueSize", "none in Triton (no queue policy for sequences); the lab's client keeps one frame "
     "in flight per sequence and skips frames that come due meanwhile", "servelab/loadgen/sequences.py", "1 frame"),
    ("sequenceBatching", f"sequence_batching, strategy {strategy}; max_batch_size",
     "config.pbtxt", f"up to {served.max_batch_size} sequences per execution"),
    ("continuousBatching: batches keep forming as sequences start and end", f"sequence_batching, strategy {strategy}",
     "config.pbtxt", "measured below"),
    ("continuousBatching: a next request while the last still streams", "iterative_sequence, for decoupled models",
     "config.pbtxt", "not used by this model"),
    ("cancel (a request that ends the sequence)", "a gRPC cancel, or the request parameter cancel with sequence_end",
     "client request; model.py", "drops the state (a gRPC cancel: once the model holds the frame; one still "
     "waiting in Triton's queue is failed there, and the state stays)"),
]  # fmt: skip
table = ["| TorchServe | here | where | value |", "| --- | --- | --- | --- |"]
display(Markdown("\n".join(table + ["| " + " | ".join(row) + " |" for row in rows])))

# %% [markdown]
# ## Sequences by hand
#
# Three photos as the frames of one sequence, over gRPC. Watch the running label and
# `FRAMES_SEEN`: the answer to the third frame depends on the first two.

# %%
client = grpcclient.InferenceServerClient(lab.triton_grpc)
photos = sorted((paths.REPO_ROOT / "gourmetgram" / "static" / "samples").glob("*.jpg"))[:3]
next_id = int(time.time()) % 1_000_000 * 1000  # IDs no earlier run of this notebook used


def frame(sequence_id: int, photo: bytes, start: bool = False, end: bool = False, **parameters):
    """Send one frame; the answer's outputs, or the error Triton or the model gave."""
    request = lab.models.get(MODEL).request(photo)
    inputs = [grpcclient.InferInput(t.name, list(t.array.shape), t.datatype) for t in request.inputs]
    for tensor, declared in zip(inputs, request.inputs, strict=True):
        tensor.set_data_from_numpy(declared.array)
    try:
        answer = client.infer(
            MODEL, inputs, sequence_id=sequence_id, sequence_start=start, sequence_end=end,
            parameters=parameters or None,
        )  # fmt: skip
    except InferenceServerException as error:
        return error
    return {
        name: answer.as_numpy(name).reshape(-1)[0]
        for name in ("SEQUENCE_LABEL", "SEQUENCE_PROBABILITY", "FRAME_LABEL", "FRAMES_SEEN")
    }


def show(what: str, answer) -> None:
    if isinstance(answer, InferenceServerException):
        print(f"{what}: ERROR {answer.message()}")
    else:
        label, probability = answer["SEQUENCE_LABEL"].decode(), answer["SEQUENCE_PROBABILITY"]
        print(f"{what}: frame says {answer['FRAME_LABEL'].decode()}; the sequence so far says {label} "
              f"({probability:.3f}) after {answer['FRAMES_SEEN']} frame(s)")  # fmt: skip


next_id += 1
for i, photo in enumerate(photos):
    show(
        f"sequence {next_id}, frame {i + 1} ({photo.name})",
        frame(next_id, photo.read_bytes(), start=i == 0, end=i == 2),
    )
show(f"sequence {next_id} again, after its END", frame(next_id, photos[0].read_bytes()))
show("a sequence never started", frame(next_id + 1, photos[0].read_bytes()))

# %% [markdown]
# ## Batching across sequences, against one sequence at a time
#
# The load generator keeps `N` sequences live (the model's `max_batch_size`), each of `LENGTH`
# frames sent one after another (the next when the previous is answered), and starts a new
# sequence whenever one ends. The same frames, sent by one sequence at a time, are the baseline.
# Triton's statistics, read before and after each run, say how many executions ran the frames,
# and at which batch sizes.
#
# **Predictions**
#
# 1. The sequence batcher puts frames of different sequences into one execution: with `N`
#    sequences the average batch is at least 2, with `oldest` and with `direct` alike. (One
#    sequence at a time is the baseline: its client keeps one frame in flight, so every execution
#    runs one frame.)
# 2. Batching pays where a batch of frames costs less per frame than a frame alone: Triton's
#    compute time per frame in the batches of `N` sequences is under 0.8x that of a frame alone,
#    and `oldest` with `N` sequences serves at least 1.2x the frames per second of one sequence
#    at a time. A GPU has parallel work to spare for a batch; a CPU whose cores already work on
#    one frame has little, so there the prediction may fail, and the check says by how much.
# 3. Where a frame waits. Triton's queue time per frame (its statistics, not the client's
#    latency) has two parts: the wait for companions, up to the strategy's
#    `max_queue_delay_microseconds` (the **queue delay**), and the wait for the execution that was
#    running when the frame arrived. A frame alone never gets a companion, so it waits out the
#    whole delay (0.8x to 1.5x of it). With `N` sequences, which all fit in one batch, a frame
#    waits at most that one execution plus the delay. Which of the two runs waits longer depends
#    on how long an execution takes on this machine: guess before you run it.

# %%
predicted_batcher_merges = None  # before you run: True if with N sequences the average batch is >= 2, else False
predicted_batching_pays = None  # and True if a frame in a batch costs < 0.8x one alone and oldest serves >= 1.2x
# the frames per second of one sequence at a time, else False
predicted_frame_waits = None  # and True if a frame alone waits out the queue delay (0.8x to 1.5x), and with N
# sequences at most one execution plus the delay, else False
N = served.max_batch_size
LENGTH = 10
DURATION_S = lab.profile.duration_s
runs = {}


def sequences_run(name: str, concurrency: int):
    """`concurrency` live sequences for DURATION_S, with Triton's account of the executions."""
    result = lab.sequences(
        MODEL, concurrency, LENGTH, name=name, duration_s=DURATION_S, warmup_sequences=1, triton_stats=True
    )
    stats = result.triton_stats
    per_frame_ms = stats["compute_ms_per_inference"]  # the executions' compute time, shared among their frames
    print(f"  {stats['inference_count']} frames in {stats['execution_count']} executions: average batch "
          f"{stats['avg_batch_size']:.2f}, {per_frame_ms:.1f} ms of compute per frame")  # fmt: skip
    runs[name] = result
    return result


alone = sequences_run(f"{MODEL}, {strategy}, 1 sequence at a time", 1)
oldest = sequences_run(f"{MODEL}, {strategy}, {N} sequences", N)
direct_strategy = lab.triton.config(MODEL).with_sequence_strategy("direct", max_queue_delay_microseconds=2000)
lab.triton.apply_config(MODEL, direct_strategy)
direct = sequences_run(f"{MODEL}, direct, {N} sequences", N)
lab.triton.restore_config(MODEL)

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
names = list(runs)
left.barh(names, [runs[n].throughput_rps for n in names], color="tab:blue")
left.set_xlabel("frames answered per second")
left.invert_yaxis()
for name in names:
    sizes = runs[name].triton_stats["executions_by_batch_size"]
    right.plot([int(s) for s in sizes], list(sizes.values()), marker="o", label=name)
right.set_xlabel("batch size (frames in one execution)")
right.set_ylabel("executions")
right.legend(fontsize=8)
fig.suptitle(f"{LENGTH}-frame sequences of {MODEL}, {lab.hardware()}")
fig.tight_layout()
plt.show()

# %%
print(f"One sequence at a time: average batch {alone.triton_stats['avg_batch_size']:.2f} (one frame in flight, "
      "so one frame per execution by construction: the baseline, not a claim)")
lab.record(sequences.batcher_merges_sequences(oldest, direct, N), predicted=predicted_batcher_merges)
lab.record(sequences.batching_pays(alone, oldest, N, lab.hardware()), predicted=predicted_batching_pays)
queue_delay_us = getattr(batcher, strategy).max_queue_delay_microseconds
lab.record(sequences.where_a_frame_waits(alone, oldest, N, queue_delay_us), predicted=predicted_frame_waits);

# %% [markdown]
# A second opinion from perf_analyzer, which sends sequences too (`sequence_length=` becomes
# `--sequence-length`; at a concurrency, each request in flight belongs to a sequence of its own):
# the same `N` live sequences against the shipped config.

# %%
checked = lab.triton.perf(MODEL, concurrency=N, sequence_length=LENGTH, sequence_length_variation=0)
if checked is not None:
    print(
        f"perf_analyzer: {checked.throughput_rps:.1f} frames/s; the lab's load generator, oldest with {N} sequences:"
        f" {oldest.throughput_rps:.1f} frames/s"
    )

# %% [markdown]
# ## More live sequences than the state cache holds
#
# The model keeps the state of at most `state_capacity` sequences; starting one more evicts the
# least recently used, and that sequence's next frame is refused with an error that says so. The
# sequence batcher itself serves up to `max_candidate_sequences` at once, more than the cache
# holds, so nothing stops the client from starting too many. Here the cache holds `CAPACITY`
# sequences, and the load generator runs `CAPACITY`, then twice as many, sequences at once, each
# started once (a broken sequence is not restarted).
#
# **Prediction** 4. At the capacity no sequence is broken off. At twice the capacity at least
# `CAPACITY` sequences are broken off, each by an `evicted` error, and the model's log counts as
# many evictions as the clients saw.

# %%
predicted_evictions = None  # before you run: True if none is broken off at the capacity, and at twice it
# at least CAPACITY are, each by an `evicted` error the model's log counts too, else False
CAPACITY = 4
lab.triton.apply_config(MODEL, lab.triton.config(MODEL).with_parameters(state_capacity=str(CAPACITY)))


def evictions_logged() -> float:
    """Evictions the model has logged so far (NaN where this notebook finds no log to read)."""
    log = lab.triton.log()
    return float("nan") if log is None else triton_stats.sequence_events(log.read_text(), MODEL).get("evicted", 0)


evicted = {}
for live in (CAPACITY, 2 * CAPACITY):
    before = evictions_logged()
    name = f"{MODEL}, state capacity {CAPACITY}, {live} sequences"
    runs[name] = lab.sequences(MODEL, live, LENGTH, name=name, sequences=live)
    evicted[live] = evictions_logged() - before
    print(f"  the model logged {evicted[live]:.0f} evictions; the clients' broken sequences: "
          f"{runs[name].sequences_failed or 'none'}")  # fmt: skip
lab.triton.restore_config(MODEL)
at_capacity, above = (runs[f"{MODEL}, state capacity {CAPACITY}, {n} sequences"] for n in (CAPACITY, 2 * CAPACITY))
lab.record(sequences.evictions_break_the_oldest(at_capacity, above, CAPACITY, evicted[2 * CAPACITY]),
           predicted=predicted_evictions);

# %% [markdown]
# ## An idle sequence expires; a cancelled one is gone
#
# With the model's idle timeout set to `IDLE_S`, one sequence pauses for half of it and then
# for twice as long. Then another sequence is cancelled by its client: its last frame carries
# the request parameter `cancel` with `sequence_end`, the model drops the state without
# computing the frame, and Triton frees the sequence's slot.
#
# **Prediction** 5. The frame after the short pause is answered; the frame after the long pause
# is refused as `expired`; the cancel is answered CANCELLED; and the cancelled sequence's next
# frame is refused, because the sequence no longer exists: Triton refuses it as a frame without
# START for a sequence it does not know. Each is judged on that specific refusal, not on any error.

# %%
predicted_idle_and_cancelled = None  # before you run: True if the short pause is answered, the long one `expired`,
# the cancel answered CANCELLED and the next frame refused as without START, else False
IDLE_S = 1.0
lab.triton.apply_config(MODEL, lab.triton.config(MODEL).with_parameters(idle_timeout_s=str(IDLE_S)))
photo = photos[0].read_bytes()
next_id += 2
show("frame 1", frame(next_id, photo, start=True))
time.sleep(IDLE_S / 2)
after_short_pause = frame(next_id, photo)
show(f"frame 2, after {IDLE_S / 2:g} s", after_short_pause)
time.sleep(2 * IDLE_S)
after_long_pause = frame(next_id, photo)
show(f"frame 3, after {2 * IDLE_S:g} s", after_long_pause)
lab.triton.restore_config(MODEL)

next_id += 1
show("another sequence, frame 1", frame(next_id, photo, start=True))
cancel_answer = frame(next_id, photo, end=True, cancel=True)
show("its cancel", cancel_answer)
after_cancel = frame(next_id, photo)
show("its next frame", after_cancel)

# %%
lab.record(sequences.idle_and_cancelled_sequences(after_short_pause, after_long_pause, cancel_answer, after_cancel,
                                                  IDLE_S), predicted=predicted_idle_and_cancelled);

# %% [markdown]
# ## A busy sequence still times out
#
# The idle timeout catches a sequence that stops sending. The **sequence timeout**
# (`sequence_timeout_s`; TorchServe's `sequenceTimeoutMSec`) bounds a sequence's whole life,
# however busy it is. Here it is set to `TOTAL_S`, with the idle timeout `IDLE_LONGER_S` above
# every pause: one sequence sends a frame every half second until 1 s before `TOTAL_S`, then
# one more half a second after it.
#
# **Prediction** 6. Every frame before `TOTAL_S` is answered, and the one after it is refused as
# `timed out` (not `expired`: the sequence never idled for `IDLE_LONGER_S`).

# %%
predicted_busy_times_out = None  # before you run: True if every frame before TOTAL_S is answered and the one
# after it is refused as `timed out` (not `expired`), else False
TOTAL_S, IDLE_LONGER_S = 3.0, 2.0
short_lived = lab.triton.config(MODEL).with_parameters(
    sequence_timeout_s=str(TOTAL_S), idle_timeout_s=str(IDLE_LONGER_S)
)
lab.triton.apply_config(MODEL, short_lived)
next_id += 1
began = time.monotonic()
kept_busy = []
for due_s in [0.5 * k for k in range(int(2 * (TOTAL_S - 1)) + 1)] + [TOTAL_S + 0.5]:
    time.sleep(max(0.0, began + due_s - time.monotonic()))  # on schedule from the first frame
    answer = frame(next_id, photo, start=due_s == 0)
    show(f"frame due at {due_s:g} s", answer)
    kept_busy.append(answer)
past_limit = kept_busy.pop()
lab.triton.restore_config(MODEL)
lab.record(sequences.busy_sequence_times_out(kept_busy, past_limit, TOTAL_S, IDLE_LONGER_S),
           predicted=predicted_busy_times_out);

# %% [markdown]
# A server that keeps state makes every sequence a small reservation: memory in the model, a
# slot in the batcher, a time limit. The settings above bound each of them, and each bound has
# an error a client can act on: start the sequence again, or stop sending.
#
# ## All the runs, and the verdicts

# %%
lab.table()
lab.verdicts()

# %% [markdown]
# ## Questions
#
# 1. Did batching frames of different sequences pay on this machine? Why, from the compute time per frame?
# 2. Which run's frames waited longer in Triton's queue, alone or with `N` sequences, and why?
# 3. Why must a server that keeps state bound it (the cache, the idle and sequence timeouts), and what
#    does a client do when it meets each bound's error?
#
# **Hand in:** the throughput and batch-size plot, the results table and the verdicts, with your
# predictions beside them.
