"""The workers' shared token: a setting across hosts, else a 0600 file under the data dir made once; and the TLS
settings every caller of the workers reads."""

import os

import pytest
from pydantic import ValidationError

from pronk.engine.tls import TlsFileError
from pronk.settings import Settings
from pronk.worker_token import WorkerTokenError, token_path, worker_client, worker_token


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


def test_a_worker_certificate_and_its_key_go_together(tmp_path, monkeypatch):
    monkeypatch.setenv("PRONK_WORKER_TLS_CERT", str(tmp_path / "worker.crt"))
    with pytest.raises(ValidationError, match="worker_tls_cert and worker_tls_key go together"):
        Settings(data_dir=tmp_path)
    monkeypatch.delenv("PRONK_WORKER_TLS_CERT")
    monkeypatch.setenv("PRONK_WORKER_TLS_KEY", str(tmp_path / "worker.key"))
    with pytest.raises(ValidationError, match="go together"):
        Settings(data_dir=tmp_path)


def test_tls_settings_name_files_only_the_processes_that_use_them_open(tmp_path, monkeypatch):
    """A router's host need not hold the workers' key: settings read paths; a worker opens its files as it starts,
    a caller its CA bundle as it makes its client, and either names a missing file."""
    for name, file in (("CERT", "worker.crt"), ("KEY", "worker.key"), ("CA", "ca.pem")):
        monkeypatch.setenv(f"PRONK_WORKER_TLS_{name}", str(tmp_path / file))
    settings = Settings(data_dir=tmp_path, worker_token="t")
    assert (settings.worker_tls_cert, settings.worker_tls_key) == (tmp_path / "worker.crt", tmp_path / "worker.key")
    with pytest.raises(TlsFileError, match=f"CA bundle {tmp_path / 'ca.pem'}: No such file"):
        worker_client(settings)
