"""The docs' own checks, fast and without torch: every relative link resolves (file and anchor), no ISO date and no
commit of this repository appears in the prose, every `specbench ...` command line the docs show parses, the
README's test command is the one CI runs, and every measured table is what its records render to."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
GUIDES = sorted(ROOT.glob("benchmarks/*/README.md"))  # benchmarks/gpu/, benchmarks/parity/: guides, not notebooks
PROSE = [*PAGES, ROOT / "ARCHITECTURE.md", *GUIDES]  # no dates, no commits: records under benchmarks/results/

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
HEX = re.compile(r"\b[0-9a-f]{7,40}\b")


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def without_code_blocks(text: str) -> str:
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def without_code(text: str) -> str:
    return re.sub(r"`[^`\n]*`", "", without_code_blocks(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lowercased, punctuation dropped (hyphens and underscores
    kept), spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in "-_ ")  # word characters, hyphens, spaces
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, heading in HEADING.findall(without_code_blocks(path.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    return LINK.findall(without_code(path.read_text(encoding="utf-8")))


def test_slug_follows_github():
    assert slug("Sampling at T > 0") == "sampling-at-t--0"
    assert slug("The papers' suites from the Hugging Face hub") == "the-papers-suites-from-the-hugging-face-hub"
    assert slug("`specbench run`") == "specbench-run"
    assert slug("Per batch size (`--batch-size 1,2,4,8`)") == "per-batch-size---batch-size-1248"
    assert slug("snake_case and τ") == "snake_case-and-τ"


@pytest.mark.parametrize("page", PROSE, ids=rel)
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (dest.is_dir() or dest.suffix != ".md" or anchor not in anchors(dest)):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{rel(page)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PROSE, ids=rel)
def test_no_iso_dates(page):
    found = [(n, m.group(0)) for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
             for m in DATE.finditer(line)]
    assert not found, f"{rel(page)}: dates belong in records under benchmarks/results/, not in the docs: {found}"


def commits(words: set[str]) -> set[str]:
    """The words that name a commit of this repository (`git cat-file -e WORD^{commit}`, asked in one batch)."""
    if not words:
        return set()
    ordered = sorted(words)
    out = subprocess.run(["git", "-C", str(ROOT), "cat-file", "--batch-check"], check=True, capture_output=True,
                         text=True, input="".join(f"{w}^{{commit}}\n" for w in ordered)).stdout.splitlines()
    return {w for w, line in zip(ordered, out) if line.endswith(" commit") or " commit " in line}


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git checkout")
@pytest.mark.parametrize("page", PROSE, ids=rel)
def test_no_commit_hashes(page):
    text = page.read_text(encoding="utf-8")
    words = {w for w in HEX.findall(text) if re.search(r"\d", w) and re.search(r"[a-f]", w)}
    found = commits(words)
    assert not found, f"{rel(page)}: commits belong in records under benchmarks/results/: {sorted(found)}"


def commands(page: Path) -> list[str]:
    """The `specbench ...` command lines in a page's code blocks: continuation lines joined, `&&` chains split,
    environment assignments and a `.venv/bin/` prefix dropped."""
    found = []
    for block in FENCE.findall(page.read_text(encoding="utf-8")):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            for part in re.split(r"&&|;|\|", line):
                try:
                    words = shlex.split(part, comments=True)
                except ValueError:  # a quote split by `|` or `;`: not a command line
                    continue
                while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                    words = words[1:]
                if words and Path(words[0]).name == "specbench" and (words[0] == "specbench"
                                                                      or words[0].endswith("/bin/specbench")):
                    found.append(shlex.join(words[1:]))
    return found


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_shown_commands_parse(page):
    from typer.testing import CliRunner

    from specbench_cli.cli import app

    runner = CliRunner()
    failed = []
    for args in commands(page):
        result = runner.invoke(app, [*shlex.split(args), "--help"])
        if result.exit_code != 0:
            failed.append(f"specbench {args}: exit {result.exit_code}: {result.output.strip()[-300:]}")
    assert not failed, "\n".join(failed)


def test_the_readme_shows_commands():
    shown = commands(README)
    assert len(shown) >= 20 and any(c.startswith("run --method baseline,suffix") for c in shown)


def test_the_readme_test_command_is_what_ci_runs():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line
          and not line.lstrip().startswith("#")]
    shown = [line.strip() for block in FENCE.findall(README.read_text(encoding="utf-8"))
             for line in block.splitlines() if "-m pytest" in line and "setup.sh" in line]
    assert len(ci) == 1 and len(shown) == 1, (ci, shown)
    assert shown[0] == ci[0]


def renderer():
    spec = importlib.util.spec_from_file_location("render_docs_tables", ROOT / "scripts" / "render_docs_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tables_are_rendered_from_their_records():
    render = renderer()
    stale = [rel(p) for p in render.pages() if render.rendered(p) != p.read_text(encoding="utf-8")]
    assert not stale, f"run python scripts/render_docs_tables.py: out of date in {stale}"
    assert sum(p.read_text(encoding="utf-8").count("<!-- table:") for p in PAGES) >= 8


def test_linked_records_say_what_how_where_and_when():
    records = {(page.parent / target.partition("#")[0]).resolve() for page in [*PAGES, *GUIDES]
               for target in links(page) if "benchmarks/results/" in target and target.endswith(".json")}
    assert records
    missing = []
    for path in sorted(records):
        record = json.loads(path.read_text(encoding="utf-8"))
        keys = {"what", "command", "machine", "date"} - set(record)
        if not ({"commit", "commits"} & set(record)):
            keys.add("commit")
        if keys:
            missing.append(f"{rel(path)}: {sorted(keys)}")
    assert not missing, missing
