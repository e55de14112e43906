"""The workers' shared token: a setting across hosts, else a 0600 file under the data dir made once."""

import os

import pytest

from pronk.settings import Settings
from pronk.worker_token import WorkerTokenError, token_path, worker_token


def test_the_first_caller_makes_a_private_token_file_that_everyone_after_reads(tmp_path):
    settings = Settings(data_dir=tmp_path / "data")
    token = worker_token(settings)
    path = token_path(settings)
    assert len(token) >= 40 and path.read_text() == token
    assert path.stat().st_mode & 0o777 == 0o600
    assert worker_token(Settings(data_dir=tmp_path / "data")) == token
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_the_setting_wins_and_no_file_is_made(tmp_path, monkeypatch):
    monkeypatch.setenv("PRONK_WORKER_TOKEN", "cluster-token")
    settings = Settings(data_dir=tmp_path)
    assert worker_token(settings) == "cluster-token"
    assert not token_path(settings).exists()
    assert "cluster-token" not in repr(settings)


def test_a_token_file_others_can_read_or_an_empty_one_is_refused(tmp_path):
    settings = Settings(data_dir=tmp_path)
    path = token_path(settings)
    path.write_text("t")
    os.chmod(path, 0o644)
    with pytest.raises(WorkerTokenError, match="chmod 600"):
        worker_token(settings)
    path.write_text("  \n")
    os.chmod(path, 0o600)
    with pytest.raises(WorkerTokenError, match="empty"):
        worker_token(settings)
