"""Folder names made from what a user or a model wrote never climb out of their root."""

from __future__ import annotations

import pytest

from pronk import paths

HOSTILE = ["..", ".", "../..", "a/../../b", "/etc/passwd", "a\0b", "x" * 5000, "", "-", "a_b", "a/b", "ü/.."]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_component_is_one_plain_folder_name_under_its_root(tmp_path, name):
    part = paths.component(name)
    assert "/" not in part and "\0" not in part and not part.startswith(".") and len(part) <= 60
    folder = paths.under(tmp_path, part)
    assert folder.parent == tmp_path and folder.resolve().is_relative_to(tmp_path.resolve())


def test_distinct_names_get_distinct_folders():
    assert len({paths.component(name) for name in HOSTILE}) == len(HOSTILE)


@pytest.mark.parametrize("parts", [("..",), ("a", "..", ".."), ("/etc",), ()])
def test_under_refuses_what_leaves_or_is_the_root(tmp_path, parts):
    with pytest.raises(paths.PathEscape):
        paths.under(tmp_path, *parts)


def test_under_refuses_a_link_that_leaves_the_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(tmp_path)
    with pytest.raises(paths.PathEscape):
        paths.under(root, "link", "x")
