"""How the domain library finds a local OpenAI-compatible server: the entry point
``nipflow.local_openai_server`` (nip_core/llm/local_server.py), never an import of the
server package. The real path (a code-validation run without ``OPENAI_BASE_URL`` starting
nipflow's server) is run end to end in tests/test_cli_run_llm_server.py."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest

from nip_core.llm import local_server
from nip_core.llm.errors import LocalServerError


def test_nipflows_own_stand_in_is_the_sibling_packages_launcher():
    from nipflow_llm_server.launcher import ensure_local_server

    found = {ep.name: ep for ep in entry_points(group=local_server.ENTRY_POINT_GROUP)}
    assert found[local_server.DEFAULT_STAND_IN].load() is ensure_local_server


@pytest.fixture
def other_stand_in(tmp_path, monkeypatch):
    """A second installed distribution registering its own stand-in (a dist-info on sys.path)."""
    site = tmp_path / "site"
    (site / "other_standin-1.0.dist-info").mkdir(parents=True)
    (site / "other_standin-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: other-standin\n"
                                                                   "Version: 1.0\n")
    (site / "other_standin-1.0.dist-info" / "entry_points.txt").write_text(
        f"[{local_server.ENTRY_POINT_GROUP}]\nother = other_standin:start\n")
    (site / "other_standin.py").write_text("def start(data_dir):\n"
                                           "    return f'http://127.0.0.1:9/v1#{data_dir.name}'\n")
    monkeypatch.syspath_prepend(str(site))
    return site


def test_a_stand_in_is_called_with_the_data_directory(other_stand_in, monkeypatch, tmp_path):
    monkeypatch.setattr(local_server, "DEFAULT_STAND_IN", "other")
    assert local_server.local_server_url(tmp_path / "llm-dir") == "http://127.0.0.1:9/v1#llm-dir"


def test_several_stand_ins_without_the_default_one_are_refused(other_stand_in, monkeypatch, tmp_path):
    monkeypatch.setattr(local_server, "DEFAULT_STAND_IN", "absent")
    with pytest.raises(LocalServerError, match=r"several local OpenAI-compatible servers are installed "
                                               r"\(nipflow, other\).*set OPENAI_BASE_URL"):
        local_server.local_server_url(tmp_path)


def test_no_stand_in_names_the_entry_point_group_and_the_missing_setting(monkeypatch, tmp_path):
    monkeypatch.setattr(local_server, "ENTRY_POINT_GROUP", "nipflow.no_such_group")
    with pytest.raises(LocalServerError) as err:
        local_server.local_server_url(tmp_path / "d")
    assert "no OPENAI_BASE_URL is set" in str(err.value)
    assert "'nipflow.no_such_group'" in str(err.value)
    assert str(Path(tmp_path / "d")) in str(err.value)
