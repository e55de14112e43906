"""The namespace hosts skip with a reason where they cannot be made, instead of failing."""

import shutil

from tests import netns


def test_without_root_the_reason_is_root(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert netns.unavailable() == "network namespaces need root"


def test_without_ip_the_reason_is_ip(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert netns.unavailable() == "no `ip` command (iproute2)"
