# %% [markdown]
# # 11. Stateful inference: sequences and the sequence batcher
#
# Some answers depend on what came before. A meal filmed as a stream of frames is one dish: a
# classifier that sees one frame at a time should answer with what the frames **so far** say. The
# model `food_sequence` does that: each request is one frame of a **sequence** (named by a sequence
# ID the client chooses; Triton calls it the correlation ID), and the answer is the sequence's
# running label and probabilities. That running mean is **state**: the server keeps it between
# requests, per sequence.
#
# TorchServe built this as "stateful inference", with **sequence batching**: one request from
# each of several sequences in one batch. TorchServe is no longer maintained; this notebook
# teaches the same on Triton's **sequence batcher**.
#
# How the sequence batcher works:
#
# - each request carries `sequence_id` and the flags `sequence_start` and `sequence_end`; Triton
#   refuses a request for a sequence it does not know unless it starts one;
# - the model sees them as **control inputs**: tensors the batcher adds to each request that tell
#   the model where a sequence starts and ends (START, END), whether a position in the batch holds
#   a request (READY), and whose (CORRID). `food_sequence` declares START, END and READY;
# - every request of a sequence goes to the same model instance, in order, one at a time;
# - **oldest** strategy: each execution (one run of the model on a batch) takes the oldest waiting
#   frame of each of up to `max_batch_size` sequences, so frames of different sequences share one
#   forward pass, and batches keep forming as sequences start and end (half of TorchServe's
#   *sequence continuous batching*);
# - **direct** strategy: each sequence is pinned to one of `max_batch_size` batch slots (positions
#   in every batch); empty slots travel along marked not READY, and the model answers them without
#   computing;
# - a Python-backend model gets no state from Triton: `food_sequence/1/model.py` keeps it, keyed
#   by `request.correlation_id()`, in a cache of `state_capacity` sequences (an LRU: full, it
#   evicts the least recently used).
#
# The other half of continuous batching, a sequence's next request served while the previous one
# still streams its answer (Triton's `iterative_sequence`, for decoupled models: many responses per
# request, notebook 10), is not used here.

# %%
# runs in the Jupyter container (Docker) or on your machine (local)
import time

import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from servelab.lab import Lab
from servelab.lessons import sequences

lab = Lab.connect("11_stateful_sequences")
MODEL = "food_sequence"
stateful = sequences.StatefulModel(lab, MODEL)  # frames by hand, runs of sequences, the model's log
print(f"The models run on {lab.hardware()}.")

# %% [markdown]
# ## TorchServe's settings, and where each lives here
#
# Values from the configuration the server runs now.

# %%
served = lab.triton.configs.config(MODEL).proto
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
# `FRAMES_SEEN`: the answer to the third frame depends on the first two. Then two frames Triton
# must refuse: one after the sequence's END, one of a sequence never started.

# %%
photos = stateful.photos(3)
next_id = int(time.time()) % 1_000_000 * 1000  # IDs no earlier run of this notebook used
next_id += 1
for i, photo in enumerate(photos):
    stateful.show(
        f"sequence {next_id}, frame {i + 1} ({photo.name})",
        stateful.frame(next_id, photo.read_bytes(), start=i == 0, end=i == 2),
    )
stateful.show(f"sequence {next_id} again, after its END", stateful.frame(next_id, photos[0].read_bytes()))
stateful.show("a sequence never started", stateful.frame(next_id + 1, photos[0].read_bytes()))

# %% [markdown]
# ## Batching across sequences, against one sequence at a time
#
# The load generator keeps `N` sequences of `LENGTH` frames live (`N`: the model's
# `max_batch_size`), each frame sent when the last is answered, a new sequence started when one
# ends. The baseline: the same, one sequence at a time. Triton's statistics around each run count
# the executions and their batch sizes.
#
# **Expectations**
#
# 1. Frames of different sequences share executions: with `N` sequences the average batch is at
#    least 2, with `oldest` and `direct` alike.
# 2. Batching pays where a batch costs less per frame: Triton's compute time per frame with `N`
#    sequences is under 0.8x that of a frame alone, and `oldest` with `N` sequences serves at least
#    1.2x the frames per second of the baseline. A GPU has parallel work to spare for a batch; a
#    CPU whose cores already work on one frame has little, so there this may fail.
# 3. Where a frame waits. Triton's queue time per frame (its statistics, not the client's latency)
#    has two parts: the wait for companions, up to the strategy's `max_queue_delay_microseconds`
#    (the **queue delay**), and the wait for the execution running when the frame arrived. Alone,
#    a frame never gets a companion: it waits out the whole delay (0.8x to 1.5x of it). With `N`
#    sequences, all in one batch, a frame waits at most that one execution plus the delay. Which
#    waits longer depends on how long an execution takes here: guess before you run.

# %%
predicted_average_batch = None  # before you run: the average batch (frames) of the oldest strategy, N sequences
predicted_frames_gain = None  # and the frames per second of N sequences over one at a time (x)
predicted_frame_wait_ms = None  # and a frame's wait in Triton's queue with N sequences (ms)

# %%
N = served.max_batch_size
LENGTH = 10
alone = stateful.run(f"{MODEL}, {strategy}, 1 sequence at a time", 1, LENGTH)
oldest = stateful.run(f"{MODEL}, {strategy}, {N} sequences", N, LENGTH)
# Your turn: direct_strategy = lab.triton.configs.config(MODEL).with_sequence_strategy(...), the direct
#   strategy with a queue delay of 2,000 microseconds (its field: max_queue_delay_microseconds; Triton's
#   model configuration guide, "Sequence Batcher", "Direct").
### BEGIN SOLUTION
direct_strategy = lab.triton.configs.config(MODEL).with_sequence_strategy("direct", max_queue_delay_microseconds=2000)
### END SOLUTION
with stateful.configured(direct_strategy):
    direct = stateful.run(f"{MODEL}, direct, {N} sequences", N, LENGTH)
runs = {run.name: run for run in (alone, oldest, direct)}

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
lab.record(sequences.batcher_merges_sequences(oldest, direct, N), predicted=predicted_average_batch)
lab.record(sequences.batching_pays(alone, oldest, N, lab.hardware()), predicted=predicted_frames_gain)
queue_delay_us = getattr(batcher, strategy).max_queue_delay_microseconds
lab.record(sequences.where_a_frame_waits(alone, oldest, N, queue_delay_us), predicted=predicted_frame_wait_ms);

# %% [markdown]
# A second opinion: perf_analyzer sends sequences too (`sequence_length=` becomes
# `--sequence-length`; each request in flight belongs to a sequence of its own). The same `N` live
# sequences, on the shipped config:

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
# Starting one sequence more than `state_capacity` evicts the least recently used, whose next frame
# is refused with an error that says so. The batcher serves up to `max_candidate_sequences` (the
# `oldest` strategy's limit on sequences it batches at once; more wait in a backlog), more than
# the cache holds, so nothing stops a client from starting too many. Here the cache holds
# `CAPACITY`; the load generator runs `CAPACITY`, then twice as many, sequences at once, each
# started once (a broken one is not restarted).
#
# **Expectation** 4. At the capacity no sequence is broken off. At twice the capacity at least
# `CAPACITY` are, each by an `evicted` error, and the model's log counts as many evictions as the
# clients saw.

# %%
CAPACITY = 4  # sequences the model's state cache holds
predicted_evicted = None  # before you run: how many of 2 x CAPACITY live sequences `evicted` breaks off

# %%
evicted, broken = {}, {}
with stateful.configured(lab.triton.configs.config(MODEL).with_parameters(state_capacity=str(CAPACITY))):
    for live in (CAPACITY, 2 * CAPACITY):
        before = stateful.evictions_logged()
        name = f"{MODEL}, state capacity {CAPACITY}, {live} sequences"
        broken[live] = lab.measurer.sequences(MODEL, live, LENGTH, name=name, sequences=live)
        evicted[live] = stateful.evictions_logged() - before
        print(
            f"  the model logged {evicted[live]:.0f} evictions; the clients' broken sequences: "
            f"{broken[live].sequences_failed or 'none'}"
        )
at_capacity, above = broken[CAPACITY], broken[2 * CAPACITY]
lab.record(sequences.evictions_break_the_oldest(at_capacity, above, CAPACITY, evicted[2 * CAPACITY]),
           predicted=predicted_evicted);

# %% [markdown]
# ## An idle sequence expires; a cancelled one is gone
#
# The model's **idle timeout** is how long a sequence may send nothing and keep its state. With it
# set to `IDLE_S`, one sequence pauses for half of it, then for twice as long. Then a client
# cancels another sequence: its last frame carries the request parameter `cancel` with
# `sequence_end`; the model drops the state without computing the frame, and Triton frees the
# sequence's batch slot.
#
# **Expectation** 5. After the short pause the frame is answered; after the long one it is refused
# as `expired`; the cancel is answered CANCELLED; the cancelled sequence's next frame is refused by
# Triton as a frame without START (the sequence is gone). Each is judged on that specific refusal,
# not on any error.

# %%
predicted_idle_and_cancelled = None  # before you run: True if the short pause is answered, the long one `expired`,
# the cancel answered CANCELLED and the next frame refused as without START, else False
IDLE_S = 1.0
photo = photos[0].read_bytes()
next_id += 2
with stateful.configured(lab.triton.configs.config(MODEL).with_parameters(idle_timeout_s=str(IDLE_S))):
    stateful.show("frame 1", stateful.frame(next_id, photo, start=True))
    time.sleep(IDLE_S / 2)
    after_short_pause = stateful.frame(next_id, photo)
    stateful.show(f"frame 2, after {IDLE_S / 2:g} s", after_short_pause)
    time.sleep(2 * IDLE_S)
    after_long_pause = stateful.frame(next_id, photo)
    stateful.show(f"frame 3, after {2 * IDLE_S:g} s", after_long_pause)

next_id += 1
stateful.show("another sequence, frame 1", stateful.frame(next_id, photo, start=True))
cancel_answer = stateful.frame(next_id, photo, end=True, cancel=True)
stateful.show("its cancel", cancel_answer)
after_cancel = stateful.frame(next_id, photo)
stateful.show("its next frame", after_cancel)

# %%
lab.record(sequences.idle_and_cancelled_sequences(after_short_pause, after_long_pause, cancel_answer, after_cancel,
                                                  IDLE_S), predicted=predicted_idle_and_cancelled);

# %% [markdown]
# ## A busy sequence still times out
#
# The **sequence timeout** (`sequence_timeout_s`; TorchServe's `sequenceTimeoutMSec`) bounds a
# sequence's whole life, however busy. Here it is `TOTAL_S`, with the idle timeout `IDLE_LONGER_S`
# above every pause: one sequence sends a frame every half second until 1 s before `TOTAL_S`, then
# one more half a second after it.
#
# **Expectation** 6. Every frame before `TOTAL_S` is answered; the one after it is refused as
# `timed out` (not `expired`: the sequence never idled for `IDLE_LONGER_S`).

# %%
predicted_busy_times_out = None  # before you run: True if every frame before TOTAL_S is answered and the one
# after it is refused as `timed out` (not `expired`), else False
TOTAL_S, IDLE_LONGER_S = 3.0, 2.0
short_lived = lab.triton.configs.config(MODEL).with_parameters(
    sequence_timeout_s=str(TOTAL_S), idle_timeout_s=str(IDLE_LONGER_S)
)
next_id += 1
kept_busy = []
with stateful.configured(short_lived):
    began = time.monotonic()
    for due_s in [0.5 * k for k in range(int(2 * (TOTAL_S - 1)) + 1)] + [TOTAL_S + 0.5]:
        time.sleep(max(0.0, began + due_s - time.monotonic()))  # on schedule from the first frame
        answer = stateful.frame(next_id, photo, start=due_s == 0)
        stateful.show(f"frame due at {due_s:g} s", answer)
        kept_busy.append(answer)
past_limit = kept_busy.pop()
lab.record(sequences.busy_sequence_times_out(kept_busy, past_limit, TOTAL_S, IDLE_LONGER_S),
           predicted=predicted_busy_times_out);

# %% [markdown]
# A server that keeps state makes every sequence a small reservation: memory in the model, a slot
# in the batcher, a time limit. Each bound above has an error a client can act on: start the
# sequence again, or stop sending.
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
