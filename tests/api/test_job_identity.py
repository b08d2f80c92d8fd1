"""A job's identity across runs (its checkpoint directory) and the resume policy: bad values
fail at construction, naming the field and what is allowed."""

import pytest

import streamsnap as ss
from streamsnap.graph.ids import check_job_id, job_id_for_name


def test_the_same_name_gives_the_same_path_safe_id_and_different_names_differ():
    assert job_id_for_name("running sum / EU") == job_id_for_name("running sum / EU")
    assert job_id_for_name("running sum / EU").startswith("running-sum-EU-")
    assert job_id_for_name("a") != job_id_for_name("b")
    assert check_job_id(job_id_for_name("../../etc")) == job_id_for_name("../../etc")
    assert "/" not in job_id_for_name("../../etc")


@pytest.mark.parametrize("bad", ["", "../x", "a/b", "x" * 101, 7])
def test_a_bad_job_id_is_refused_before_anything_runs(bad):
    env = ss.StreamEnvironment(parallelism=1)
    env.from_collection([{"a": 1}]).sink_to(ss.sinks.Collect())
    with pytest.raises(ss.ConfigurationError, match="job_id must be 1-100 letters"):
        env.execute("job", job_id=bad)


def test_resume_accepts_latest_or_never_only():
    assert ss.CheckpointConfig(directory="/tmp/x").resume == "latest"
    with pytest.raises(ss.ConfigurationError, match="resume.*latest.*never"):
        ss.CheckpointConfig(directory="/tmp/x", resume="always")
