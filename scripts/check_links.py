#!/usr/bin/env python
"""Checks that every link in README.md and docs/*.md resolves inside the repository.

A link must be relative, must not leave the repository, and must name a file
or directory that exists; web addresses are refused too, so the documents
never point outside the repository (loopback addresses, a server the reader
runs on their own machine, are allowed). Exits 1 and lists the bad links.

    python scripts/check_links.py
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# [text](target) and ![alt](target); the target ends at whitespace or ')'.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
WEB = re.compile(r"\b(?:https?|ftp)://(?!(?:127\.0\.0\.1|localhost)[:/])\S+")


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def bad_links(path: Path, root: Path = ROOT) -> list[str]:
    """'file:line: target (why)' for every link of `path` that does not resolve inside `root`."""
    problems = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        where = f"{path.relative_to(root)}:{lineno}"
        problems += [f"{where}: {url} (a web address)" for url in WEB.findall(line)]
        for target in LINK.findall(line):
            if WEB.match(target):
                continue  # reported above
            file_part = target.split("#", 1)[0]
            if not file_part:
                continue  # an anchor in the same document
            if file_part.startswith("/"):
                problems.append(f"{where}: {target} (absolute path)")
                continue
            resolved = (path.parent / file_part).resolve()
            if not resolved.is_relative_to(root):
                problems.append(f"{where}: {target} (outside the repository)")
            elif not resolved.exists():
                problems.append(f"{where}: {target} (no such file)")
    return problems


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, usage="python scripts/check_links.py",
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    docs = documents()
    problems = [p for doc in docs for p in bad_links(doc)]
    for p in problems:
        print(p)
    links = sum(len(LINK.findall(doc.read_text())) for doc in docs)
    print(f"{len(docs)} documents, {links} links, {len(problems)} bad")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
