"""Triton's statistics, read before and after a measured block (servelab.triton.stats)."""

from __future__ import annotations

import base64
import copy
import math

import numpy as np
import pytest
import tritonclient.http as httpclient

from servelab.triton import stats as triton_stats
from servelab.triton.stats import StatsDelta, TritonStatsError
from tests.helpers.triton_stats import snapshot


def _classify(address: str, images: list[bytes]) -> None:
    encoded = [base64.b64encode(raw).decode() for raw in images]
    model_input = httpclient.InferInput("INPUT_IMAGE", [len(encoded), 1], "BYTES")
    model_input.set_data_from_numpy(np.array([[item] for item in encoded], dtype=object))
    httpclient.InferenceServerClient(address).infer("food_classifier", [model_input])


def _one_batch_of_three_and_two_singles(address: str, images: list[bytes]) -> None:
    _classify(address, images[:3])
    _classify(address, images[3:4])
    _classify(address, images[4:5])


def _check_three_requests_five_images(delta: StatsDelta) -> None:
    counts = (delta.model, delta.inference_count, delta.execution_count, delta.success_count, delta.fail_count)
    # The whole delta in every message: should this fail, it shows what the server did instead.
    assert counts == ("food_classifier", 5, 3, 3, 0), delta
    assert delta.executions_by_batch_size == {3: 1, 1: 2}, delta
    assert delta.avg_batch_size == pytest.approx(5 / 3)
    averages = (delta.avg_queue_us, delta.avg_compute_input_us, delta.avg_compute_infer_us, delta.avg_compute_output_us)
    assert all(average > 0 for average in averages), delta
    # Running the model is part of a request's time in the server.
    assert delta.avg_compute_infer_us < delta.avg_request_us, delta


@pytest.mark.integration
def test_stats_difference_counts_images_executions_and_batch_sizes(triton_http_url, test_images):
    before = triton_stats.fetch(triton_http_url, "food_classifier")
    _one_batch_of_three_and_two_singles(triton_http_url, test_images)
    after = triton_stats.fetch_settled(triton_http_url, "food_classifier")
    delta = triton_stats.diff(before, after)
    _check_three_requests_five_images(delta)
    assert delta.to_dict()["executions_by_batch_size"] == {3: 1, 1: 2}


@pytest.mark.integration
def test_measure_context_manager_gives_the_same_difference(triton_http_url, test_images):
    with triton_stats.counted_over(f"http://{triton_http_url}", "food_classifier") as stats:
        assert stats.delta is None
        _one_batch_of_three_and_two_singles(triton_http_url, test_images)
    _check_three_requests_five_images(stats.delta)


@pytest.mark.integration
def test_measure_leaves_no_delta_when_the_block_fails(triton_http_url):
    with pytest.raises(KeyError):
        with triton_stats.counted_over(triton_http_url, "food_classifier") as stats:
            raise KeyError("the load generator failed")
    assert stats.delta is None


@pytest.mark.integration
def test_unknown_model_is_a_clear_error(triton_http_url):
    with pytest.raises(TritonStatsError, match=r"no statistics for model 'no_such_model'.*not available"):
        triton_stats.fetch(triton_http_url, "no_such_model")


def test_unreachable_server_is_a_clear_error():
    with pytest.raises(TritonStatsError, match="cannot read Triton statistics"):
        triton_stats.fetch("127.0.0.1:1", "food_classifier", timeout_s=2)


def test_diff_of_synthetic_snapshots():
    before = snapshot(inferences=10, executions=6, requests=8, ms_each=2.0, batches={1: 4, 2: 2})
    # 12 more requests, 4 ms each, made 20 more inferences in 8 more executions; batch size 4 is new.
    after = snapshot(
        inferences=30, executions=14, requests=20, ms_each=(8 * 2.0 + 12 * 4.0) / 20, batches={1: 6, 2: 2, 4: 6}
    )
    delta = triton_stats.diff(before, after)
    assert (delta.model, delta.inference_count, delta.execution_count) == ("m", 20, 8)
    assert (delta.success_count, delta.fail_count) == (12, 0)
    assert delta.avg_queue_us == pytest.approx(4000)
    assert delta.avg_compute_infer_us == pytest.approx(4000)
    assert delta.avg_request_us == pytest.approx(4000)
    assert delta.executions_by_batch_size == {1: 2, 4: 6}  # batch size 2 did not run in between
    assert delta.avg_batch_size == pytest.approx(2.5)
    # 8 executions of 1 us each (the synthetic batch_stats) computed the 20 inferences.
    assert delta.compute_ms_per_inference == pytest.approx(8 * 1000 / 1e6 / 20)
    # Per batch size: 2 executions of 1 image, and 6 of 4 images, each execution 1 us.
    assert delta.compute_ms_per_inference_by_batch_size == pytest.approx({1: 0.001, 4: 0.001 / 4})


def test_diff_of_an_idle_interval_has_no_averages():
    idle = snapshot(inferences=3, executions=3, requests=3, ms_each=1.0, batches={1: 3})
    delta = triton_stats.diff(idle, copy.deepcopy(idle))
    assert (delta.inference_count, delta.execution_count, delta.executions_by_batch_size) == (0, 0, {})
    assert math.isnan(delta.avg_queue_us) and math.isnan(delta.avg_batch_size)


def test_diff_refuses_snapshots_it_cannot_compare():
    earlier = snapshot(inferences=10, executions=10, requests=10, ms_each=1.0, batches={1: 10})
    reloaded = snapshot(inferences=2, executions=2, requests=2, ms_each=1.0, batches={1: 2})
    with pytest.raises(TritonStatsError, match="reloaded"):
        triton_stats.diff(earlier, reloaded)
    two_versions = {"model_stats": earlier["model_stats"] * 2}
    with pytest.raises(TritonStatsError, match="version="):
        triton_stats.diff(two_versions, two_versions)
