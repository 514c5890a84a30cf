"""The README and docs/ link only to files inside the repository (scripts/check_links.py)."""
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _checker():
    spec = importlib.util.spec_from_file_location("check_links", REPO / "scripts" / "check_links.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_link_resolves_inside_the_repository():
    check = _checker()
    docs = check.documents()
    assert REPO / "README.md" in docs and REPO / "docs" / "architecture.md" in docs
    assert [p for doc in docs for p in check.bad_links(doc)] == []


def test_the_checker_finds_bad_links(tmp_path):
    check = _checker()
    (tmp_path / "docs").mkdir()
    (tmp_path / "there.md").write_text("x")
    doc = tmp_path / "docs" / "d.md"
    doc.write_text("[ok](../there.md) [anchor](#top) [gone](missing.md)\n"
                   "![out](../../elsewhere.png) see https://example.com [abs](/etc/passwd)\n"
                   "curl http://127.0.0.1:8000/v1/models http://localhost/x http://127.0.0.1.example.com/\n")
    problems = check.bad_links(doc, tmp_path)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "missing.md (no such file)", "https://example.com (a web address)",
        "../../elsewhere.png (outside the repository)", "/etc/passwd (absolute path)",
        "http://127.0.0.1.example.com/ (a web address)"]
