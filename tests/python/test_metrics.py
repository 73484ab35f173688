"""zerowait.metrics: the text a real Loader, Checkpointer and StepProfiler render, read back by
prometheus_client's own parser; node_exporter's textfile written whole; the /metrics endpoint
scraped over real HTTP."""

from __future__ import annotations

import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import zerowait
from zerowait import metrics

STEPS, BATCH = 6, 4


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("metrics-data")
    rng = np.random.default_rng(5)
    zerowait.write_dataset(({"x": rng.bytes(500), "cls": b"1"} for _ in range(64)), out)
    return out


@pytest.fixture()
def sources(dataset, tmp_path):
    """A loader, a checkpointer with two committed steps, and a profiler over 6 steps (each a
    10 ms sleep inside a "communication" phase)."""
    with zerowait.Loader(dataset, batch_size=BATCH, threads=1) as loader, \
            zerowait.Checkpointer(tmp_path / "ckpt") as ckpt:
        prof = zerowait.StepProfiler(loader, ckpt, sample_system=False)
        batches = iter(loader)
        for step in range(STEPS):
            with prof.step(samples=BATCH):
                next(batches)
                with prof.phase("communication"):
                    time.sleep(0.01)
                if step in (2, 5):
                    ckpt.save(step, {"w": torch.ones(16)}, blocking=True)
        prof.close()
        yield dict(loader=loader, checkpointer=ckpt, profiler=prof)


def parse(text: str) -> dict:
    """family name -> (type, {(sample name, sorted labels): value})."""
    return {f.name: (f.type, {(s.name, tuple(sorted(s.labels.items()))): s.value
                              for s in f.samples})
            for f in text_string_to_metric_families(text)}


def value(families: dict, family: str, sample: str | None = None, **labels: str) -> float:
    return families[family][1][(sample or family, tuple(sorted(labels.items())))]


def test_render_parses_back_with_the_expected_values(sources):
    loader, ckpt, prof = sources["loader"], sources["checkpointer"], sources["profiler"]
    families = parse(metrics.render(**sources))
    stats = loader.stats()
    assert families["zerowait_loader_batches"][0] == "counter"
    assert value(families, "zerowait_loader_batches", "zerowait_loader_batches_total") == \
        stats["batches"]
    assert value(families, "zerowait_loader_read_bytes",
                 "zerowait_loader_read_bytes_total") == stats["bytes_read"]
    # wait_s only grows; it was read after the render's
    assert 0 < value(families, "zerowait_loader_wait_seconds",
                     "zerowait_loader_wait_seconds_total") <= stats["wait_s"]
    assert families["zerowait_loader_arenas_free"][0] == "gauge"
    assert value(families, "zerowait_checkpoint_saves", "zerowait_checkpoint_saves_total") == 2
    assert value(families, "zerowait_checkpoint_blocked_seconds",
                 "zerowait_checkpoint_blocked_seconds_total") == pytest.approx(ckpt.blocked_s)
    assert value(families, "zerowait_checkpoint_last_committed_step") == 5

    steps = prof.steps()
    walls = [s["wall"] for s in steps]
    assert families["zerowait_step_seconds"][0] == "histogram"
    assert value(families, "zerowait_step_seconds", "zerowait_step_seconds_count") == STEPS
    assert value(families, "zerowait_step_seconds", "zerowait_step_seconds_sum") == \
        pytest.approx(sum(walls))
    for bound in (0.005, 0.01, 0.025, 0.05, 0.1):
        assert value(families, "zerowait_step_seconds", "zerowait_step_seconds_bucket",
                     le=str(bound)) == sum(w <= bound for w in walls)
    assert value(families, "zerowait_step_seconds", "zerowait_step_seconds_bucket",
                 le="+Inf") == STEPS
    assert value(families, "zerowait_step_input_wait_seconds",
                 "zerowait_step_input_wait_seconds_sum") == \
        pytest.approx(sum(s["input"] for s in steps))
    assert families["zerowait_step_wait_seconds"][0] == "counter"
    for cause in ("input", "checkpoint", "communication"):
        assert value(families, "zerowait_step_wait_seconds", "zerowait_step_wait_seconds_total",
                     cause=cause) == pytest.approx(sum(s[cause] for s in steps))
    assert value(families, "zerowait_step_wait_seconds", "zerowait_step_wait_seconds_total",
                 cause="communication") >= STEPS * 0.01


def test_render_takes_loader_and_checkpointer_from_the_profiler(sources):
    names = set(parse(metrics.render(profiler=sources["profiler"])))
    assert {"zerowait_loader_batches", "zerowait_checkpoint_saves",
            "zerowait_step_seconds"} <= names


def test_write_textfile_is_never_seen_half_written(sources, tmp_path):
    path = tmp_path / "textfile" / "zerowait.prom"
    path.parent.mkdir()
    with pytest.raises(ValueError, match=r"\.prom"):
        metrics.write_textfile(tmp_path / "textfile" / "zerowait.txt", **sources)
    metrics.write_textfile(path, **sources)
    whole = path.read_text()
    seen, stop = [], threading.Event()

    def read_while_written() -> None:
        while not stop.is_set():
            seen.append(path.read_text())

    reader = threading.Thread(target=read_while_written)
    reader.start()
    try:
        for _ in range(200):
            metrics.write_textfile(path, **sources)
    finally:
        stop.set()
        reader.join()
    assert seen
    # Every read is a complete file: the families end where the whole one does.
    last_line = whole.splitlines()[-1].rsplit(" ", 1)[0]
    families = set(parse(whole))
    for text in set(seen):
        assert text.endswith("\n") and text.splitlines()[-1].startswith(last_line), text[-200:]
        assert set(parse(text)) == families
    assert os.listdir(path.parent) == ["zerowait.prom"]  # no temporary left behind
    assert path.stat().st_mode & 0o777 == 0o644


def test_serve_answers_scrapes_over_http(sources):
    prof = sources["profiler"]
    with metrics.serve(**sources) as server:
        assert server.port > 0 and server.url.endswith(f":{server.port}/metrics")
        with urllib.request.urlopen(server.url, timeout=10) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            families = parse(response.read().decode())
        assert value(families, "zerowait_step_seconds", "zerowait_step_seconds_count") == STEPS

        # Rendered at each scrape: two more steps show up in the next one.
        for _ in range(2):
            with prof.step():
                time.sleep(0.001)
        prof.close()
        with urllib.request.urlopen(server.url, timeout=10) as response:
            families = parse(response.read().decode())
        assert value(families, "zerowait_step_seconds", "zerowait_step_seconds_count") == \
            STEPS + 2

        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(server.url.replace("/metrics", "/other"), timeout=10)
        assert error.value.code == 404
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=2)
