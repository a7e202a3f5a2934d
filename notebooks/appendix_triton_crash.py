# %% [markdown]
# # Appendix: Triton 2.51's cancellation crash
#
# An optional debugging exercise on the lab's own stack, part of neither part of the lab. Notebook 10
# cancels gRPC requests to Triton; Triton 2.51, the lab's release (locally and on the node), can
# crash under them (`Signal (11) received`). Here you measure when, and why notebook 10's deadline mostly
# avoids it.
#
# The bug: upstream issues triton-inference-server/server#7368 and #8034, fixed by pull request
# #7840 in release 24.12 (Triton 2.53), whose ONNX Runtime backend has no code for the node's P100s,
# so the lab stays on 24.10 (`docker/Dockerfile.triton`). The fix describes a
# **race** (two threads touching the same state, the outcome depending on which goes first): a
# cancellation reaches the server and waits for the gRPC thread that handles it; if the request's
# answer is completed in that moment, the answer's path frees the request's state, which the
# cancellation's handler then uses. The same race can leave the server **hung** instead (a lock
# never released: it stops answering, and its log stops); the probe counts either.

# %%
from servelab.lab import Lab
from servelab.lessons import cancellation

lab = Lab.connect("appendix_triton_crash")
PATIENT, IMPATIENT = 4, 4  # notebook 10's clients
PROBE_S = max(lab.profile.duration_s, 8)  # seconds of probing per deadline, at most
ALONE_S = 3  # seconds of one client at a time, to measure a request alone
RACE_FIXED_IN = (2, 53)
TRITON_MODEL = "food_classifier_onnx"
one_at_a_time = (  # notebook 10's config: one instance, one request per execution, dynamic batching
    lab.triton.configs.config(TRITON_MODEL)
    .with_fields(max_batch_size=1)
    .with_instance_groups([{"count": 1, "kind": "KIND_GPU", "gpus": [0]}])  # a CPU one without a GPU
    .with_dynamic_batching()
)

# %% [markdown]
# ## The probe
#
# Which cancellations race depends on *when* a cancellation reaches the server, relative to its
# request's answer. Triton's **verbose log** (every step of every request, turned on through its
# logging API) says where each request was when its cancellation was handled: START (not yet
# read), ISSUED (in the queue or in the model), COMPLETE (its answer being written) or FINISH (its
# answer sent). The probe compares two deadlines, each for up to `PROBE_S` seconds, stopping at a
# crash:
#
# - **the lesson's**: notebook 10's clients, giving up after `s` (the latency of a request alone)
#   while patient clients are queued ahead of them;
# - **at the service time**: two clients alone, each giving up after `s`, so that an answer is
#   often being completed just as its client gives up.
#
# Verbose logging slows every step the server takes, the handling of a cancellation included,
# which widens the race's window: the probe sees in seconds what otherwise takes minutes. Locally
# it runs against a Triton of this notebook's own, with the same model and config, so the lab's
# server is never crashed on purpose; in Docker (the node's image and the CPU variant's stand-in are
# both 2.51), against the Compose project's: Docker restarts it when it crashes, and the runs it
# interrupted are marked.
#
# **Expectation**, on a release with the race (2.51): at the service-time deadline, a larger share
# of the cancellations is handled as the answer completes (COMPLETE or FINISH) than at the
# lesson's, by more than twice the standard error of the difference of the two shares (the chance
# difference between two shares of so many cancellations); the server crashes there, but not at
# the lesson's deadline. On a release with the fix, neither deadline crashes it. A deadline where
# no client gave up, or the log shows no cancellation handled, tells nothing of the race: what reads
# it is NOT CHECKED.

# %%
predicted_triton_race = None  # before you run: True if the expectation holds for this Triton (2.51: the service-time
# deadline races more and crashes it, the lesson's does not; fixed: neither crashes it), else False
probes = {}
with cancellation.probe_server(lab, TRITON_MODEL, one_at_a_time) as triton:
    version = lab.triton.configs.version(triton.http)
    alone = lab.measurer.closed_loop(
        triton.grpc, 1, ALONE_S, name="probe, 1 client", kind="triton-grpc", model=TRITON_MODEL
    )
    s = alone.latency.p50_ms / 1000
    lessons_pace = cancellation.pacing(alone.latency.p50_ms, IMPATIENT)
    probes["the lesson's deadline"] = cancellation.cancellation_probe(
        lab, triton, TRITON_MODEL, "probe, the lesson's deadline", PATIENT + IMPATIENT, IMPATIENT, lessons_pace, PROBE_S
    )
    probes["at the service time"] = cancellation.cancellation_probe(
        lab, triton, TRITON_MODEL, "probe, deadline at s", 2, 2, (s, 0.0), PROBE_S
    )

print(f"Triton {'.'.join(map(str, version))}; a request alone (s) {1000 * s:.1f} ms; up to {PROBE_S:g} s each")
print("\n".join(cancellation.probe_rows(probes)))

# %%
lab.record(cancellation.triton_cancellation_race(alone, probes["the lesson's deadline"], probes["at the service time"],
                                                 version, RACE_FIXED_IN, PROBE_S, lab.cores),
           predicted=predicted_triton_race);

# %% [markdown]
# What this means for notebook 10: its deadline makes clients give up while their request still
# waits, which the table shows at the step where the server handled each cancellation. On 2.51
# that makes the race rarer, not impossible. So the local stack (and Docker, in the Compose
# project) restarts a Triton that crashes,
# the lab marks a run the crash interrupted (NOT A CLEAN RUN), notebook 10 measures such a Triton
# run once more, and a marked run never feeds a verdict (it is NOT CHECKED).
#
# ## All the runs, and the verdict

# %%
lab.table()
lab.verdicts()

# %% [markdown]
# ## Questions
#
# 1. At which steps did the server handle the cancellations at each deadline, and how does that
#    explain where it crashed?
# 2. Why does verbose logging make the race easier to hit?
# 3. A crash you cannot reproduce on demand: what would you report upstream, and what would you
#    change in the lab while waiting for the fix?
#
# **Hand in:** the probe's table and the verdict, with your prediction beside it.
