"""The `local` provider asked for n outputs: n different clips, each served under its own signed URL, all billed,
and still answered for after a restart. Real ffmpeg throughout."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from aivedio_engine.media import render
from aivedio_engine.providers.base import JobStatus, Observation
from aivedio_engine.providers.local import LocalProvider
from tests.media.test_local_provider import (  # noqa: F401 - fixtures
    _download,
    _request,
    _status,
    _submit,
    clock,
    make_provider,
    provider,
    wait_for,
)


def test_n_outputs_are_rendered_served_and_billed(make_provider: Callable[..., LocalProvider], tmp_path: Path) -> None:
    provider = make_provider()
    job_id = _submit(provider, _request(n=3), "key-three")
    obs = wait_for(provider, job_id, JobStatus.SUCCEEDED, JobStatus.FAILED)
    assert obs.status is JobStatus.SUCCEEDED, obs
    assert [o.index for o in obs.outputs] == [0, 1, 2]
    assert obs.billed_outputs == 3
    digests = set()
    for out in obs.outputs:
        status, kind = _download(out.url, tmp_path / f"{out.index}.mp4")
        assert (status, kind) == (200, "video/mp4")
        data = (tmp_path / f"{out.index}.mp4").read_bytes()
        assert len(data) == out.size_bytes
        digests.add(hashlib.sha256(data).hexdigest())
    assert len(digests) == 3  # three different clips
    # a signature is for one output: output 1's signature does not open output 2
    forged = obs.outputs[1].url.replace(f"{job_id}-1.mp4", f"{job_id}-2.mp4")
    assert _status(forged) == 403

    provider.close()
    again = make_provider(data_dir=tmp_path)  # a restarted process finds every output on disk
    recovered = again.query(job_id)
    assert isinstance(recovered, Observation) and recovered.status is JobStatus.SUCCEEDED
    assert [o.index for o in recovered.outputs] == [0, 1, 2] and recovered.billed_outputs == 3


def test_one_output_is_as_before(make_provider: Callable[..., LocalProvider]) -> None:
    provider = make_provider()
    job_id = _submit(provider, _request(), "key-one")
    obs = wait_for(provider, job_id, JobStatus.SUCCEEDED, JobStatus.FAILED)
    assert [o.index for o in obs.outputs] == [0] and obs.billed_outputs is None
    assert f"/outputs/{job_id}.mp4?" in obs.outputs[0].url


def test_variant_zero_renders_exactly_the_single_output_argv(tmp_path: Path) -> None:
    spec = render.make_spec("360p", "16:9", 2, seed=11)
    out, image = tmp_path / "o.mp4", tmp_path / "ref.png"
    for ref in (None, image):
        plain = tuple(render.clip_argv(spec, out, image=ref))
        assert tuple(render.clip_argv(replace(spec, variant=0), out, image=ref)) == plain
        others = {tuple(render.clip_argv(replace(spec, variant=v), out, image=ref)) for v in (1, 2, 3)}
        assert len(others) == 3 and plain not in others
