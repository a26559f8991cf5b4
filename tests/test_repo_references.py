"""Every file a comment or a doc points at is in this repository.

Issue 13 found code comments citing docs/fgd-openb.md, docs/extender-protocol.md and shared/docs/ray.md:
notes that lived beside the repository and that no reader of it has. The reference material is now
the repository's own (docs/fragmentation.md, docs/wire-protocol.md, docs/ray-notes.md); these tests
keep it that way, and catch a pointer left stale when a module moves (extender/kube/health.py became
extender/watch_health.py in the same issue).

Data is another matter: the openb trace is research-use data that is never committed, and commands
that read it name where it is read from (../shared/data/openb); only reference material is checked.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP_DIRS = ("extender", "gpu_sharing", "raybridge", "tessera_contract", "docs", "tests", "testing", "bench", "tools",
            "manifests", "scripts", "docker")
REPO_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(TOP_DIRS) + r")/[\w./-]*\w\.(?:py|md|yaml|yml|json|png|sh|html|csv))")
MARKDOWN_LINK = re.compile(r"\]\(([\w./-]+\.md)(?:#[\w-]*)?\)")
OUTSIDE_DOCS = re.compile(r"shared/docs|\.\./docs/|docs/anchors")
# Paths that name a file of another repository the text cites, not one of ours.
CITED_ELSEWHERE = {
    "scripts/generate_config_and_run.py",  # docs/fragmentation.md: the FGD artifact's (hkust-adsl/kubernetes-scheduler-simulator)
}


def _texts() -> list[tuple[str, str]]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\n")
    out = []
    for name in listed:
        path = ROOT / name
        if name and path.suffix in (".py", ".md", ".yaml", ".yml", ".sh", ".cfg", ".toml") and path.is_file():
            out.append((name, path.read_text(errors="replace")))
    return out


TEXTS = _texts()


def test_the_repository_was_read():
    assert any(name == "extender/service.py" for name, _ in TEXTS) and len(TEXTS) > 100


def test_no_comment_or_doc_points_at_reference_material_outside_the_repository():
    bad = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
           for name, text in TEXTS if name != "tests/test_repo_references.py" for m in OUTSIDE_DOCS.finditer(text)]
    assert not bad, "pointers outside the repository: " + "; ".join(bad)


def test_every_repository_path_named_in_code_and_docs_exists():
    missing = []
    for name, text in TEXTS:
        if name == "tests/test_repo_references.py":
            continue  # names the stale pointers it was written for
        here = (ROOT / name).parent
        refs = {m.group(1) for m in REPO_PATH.finditer(text)} - CITED_ELSEWHERE
        for ref in sorted(refs):
            if not ((ROOT / ref).exists() or (here / ref).exists()):
                missing.append(f"{name} names {ref}")
        for ref in sorted({m.group(1) for m in MARKDOWN_LINK.finditer(text)}):
            if not (here / ref).exists() and not (ROOT / ref).exists():
                missing.append(f"{name} links {ref}")
    assert not missing, "no such file in the repository: " + "; ".join(missing)


def test_the_check_catches_the_pointers_issue_13_found():
    found = [p for p in ("docs/fgd-openb.md", "docs/extender-protocol.md") if REPO_PATH.search(f"see {p} §2")]
    assert found == ["docs/fgd-openb.md", "docs/extender-protocol.md"]
    assert not (ROOT / "docs/fgd-openb.md").exists() and OUTSIDE_DOCS.search("(shared/docs/ray.md)")


HEADING_REFERENCE = re.compile(r'(docs/[\w-]+\.md),? "([^"\n]{3,80})"')


def test_every_quoted_heading_a_doc_or_manifest_points_at_exists():
    """Manifests sent readers to a section of the admin guide called Certificates, renamed long before: a reader
    found nothing there."""
    missing = []
    for name, text in _texts():
        for doc, heading in HEADING_REFERENCE.findall(text):
            target = ROOT / doc
            if not target.is_file():
                continue  # a missing file is the test above's
            headings = [line.lstrip("#").strip() for line in target.read_text().splitlines() if line.startswith("#")]
            if not any(h.startswith(heading) or heading in h for h in headings):
                missing.append(f"{name}: {doc} \"{heading}\"")
    assert not missing, missing
