"""The layout rules of docs/architecture.md hold for the code as it is.

The table "Which component may include which" in docs/architecture.md is the source of truth:
this test reads it, then every `#include "..."` under src/ and include/zerowait/, and fails on an
include that crosses to a component the table does not allow, on a component folder the table
does not name, and on a public header that includes an internal one.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def allowed_includes() -> dict[str, set[str]]:
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## Which component may include which", 1)[1].split("\n## ", 1)[0]
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("component", "") or set(cells[0]) <= {"-"}:
            continue
        table[cells[0]] = {c.strip() for c in cells[1].split(",") if c.strip() not in ("", "—")}
    assert table, "docs/architecture.md has no include table"
    return table


def component_of_file(path: Path) -> str:
    rel = path.relative_to(REPO).parts
    return rel[1] if rel[0] == "src" else rel[2]  # src/<c>/... or include/zerowait/<c>/...


def component_of_include(name: str) -> tuple[str, bool]:
    """(component, is_public) of an include path as written in the source."""
    parts = name.split("/")
    if parts[0] == "zerowait":
        return parts[1], True
    return parts[0], False


def source_files() -> list[Path]:
    files = []
    for root in (REPO / "src", REPO / "include" / "zerowait"):
        files += [p for p in root.rglob("*") if p.suffix in (".cpp", ".hpp", ".h")]
    assert files, "no sources found"
    return sorted(files)


def test_every_component_folder_is_in_the_table():
    table = allowed_includes()
    folders = {p.name for p in (REPO / "src").iterdir() if p.is_dir()}
    folders |= {p.name for p in (REPO / "include" / "zerowait").iterdir() if p.is_dir()}
    assert folders - table.keys() == set(), "add these components to docs/architecture.md"
    assert not list((REPO / "include" / "zerowait").glob("*.hpp")), (
        "public headers live in include/zerowait/<component>/"
    )


def test_includes_follow_the_table():
    table = allowed_includes()
    broken = []
    for path in source_files():
        own = component_of_file(path)
        for name in INCLUDE_RE.findall(path.read_text()):
            target, public = component_of_include(name)
            if target not in table:
                broken.append(f"{path.relative_to(REPO)}: #include \"{name}\" names no component")
            elif target != own and target not in table[own]:
                broken.append(f"{path.relative_to(REPO)}: {own} may not include {target} ({name})")
            if path.is_relative_to(REPO / "include") and not public:
                broken.append(f"{path.relative_to(REPO)}: public header includes internal {name}")
    assert broken == [], "\n".join(broken)


def test_the_table_has_no_cycles():
    table = allowed_includes()
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> None:
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", "cycle: " + " -> ".join(trail + [node])
        state[node] = "open"
        for dep in table.get(node, ()):
            visit(dep, trail + [node])
        state[node] = "done"

    for component in table:
        visit(component, [])
