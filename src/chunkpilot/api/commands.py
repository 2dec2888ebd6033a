"""``chunkpilot crds``: generate, check and document the CRDs; validate manifests offline."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from chunkpilot.api.common import ManifestError
from chunkpilot.api.crdgen import rendered_files, write_crds
from chunkpilot.api.docs import render_reference
from chunkpilot.api.inferenceservice import InferenceService
from chunkpilot.api.names import ISVC_KIND, TRIAL_KIND
from chunkpilot.api.tuningtrial import TuningTrial

CRDS_DIR = Path("crds")
#: The Helm chart ships its own copy of the generated CRDs.
CHART_CRDS_DIR = Path("charts/chunkpilot/crds")
DOCS_FILE = Path("docs/reference/crds.md")


def repo_root(start: Path | None = None) -> Path:
    """The nearest directory at or above ``start`` (default: cwd) holding pyproject.toml and crds/."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "pyproject.toml").is_file() and (candidate / CRDS_DIR).is_dir():
            return candidate
    return here


def _diff(path: Path, expected: str) -> str:
    actual = path.read_text(encoding="utf-8") if path.exists() else ""
    if actual == expected:
        return ""
    return "".join(
        difflib.unified_diff(
            actual.splitlines(keepends=True),
            expected.splitlines(keepends=True),
            fromfile=f"{path} (committed)",
            tofile=f"{path} (generated)",
        )
    )


def stale_files(crds_dir: Path, docs_file: Path | None) -> dict[Path, str]:
    """Every generated file that differs from what is on disk, with its unified diff."""
    expected = {crds_dir / name: text for name, text in rendered_files().items()}
    if docs_file is not None:
        expected[docs_file] = render_reference()
    diffs = {path: _diff(path, text) for path, text in expected.items()}
    return {path: diff for path, diff in diffs.items() if diff}


def iter_documents(path: Path) -> Iterator[dict[str, Any]]:
    """The non-empty YAML documents of a file."""
    with path.open(encoding="utf-8") as stream:
        for document in yaml.safe_load_all(stream):
            if document:
                yield document


def validate_document(document: dict[str, Any]) -> None:
    """Validate one manifest with the API model; raises ManifestError."""
    kind = document.get("kind")
    if kind == ISVC_KIND:
        InferenceService.from_manifest(document)
    elif kind == TRIAL_KIND:
        TuningTrial.from_manifest(document)
    else:
        raise ManifestError(str(kind), [("kind", f"expected {ISVC_KIND} or {TRIAL_KIND}, got {kind!r}")])


# --------------------------------------------------------------------------- handlers


def _generate(args: argparse.Namespace) -> int:
    outs = [args.out] if args.out else [repo_root() / CRDS_DIR, repo_root() / CHART_CRDS_DIR]
    for out in outs:
        for path in write_crds(out):
            print(f"wrote {path}")
    return 0


def _docs(args: argparse.Namespace) -> int:
    out: Path = args.out or repo_root() / DOCS_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_reference(), encoding="utf-8")
    print(f"wrote {out}")
    return 0


def _check(args: argparse.Namespace) -> int:
    root = repo_root()
    crds_dir = args.dir or root / CRDS_DIR
    docs_file = None if args.no_docs else (args.docs or root / DOCS_FILE)
    stale = stale_files(crds_dir, docs_file)
    if not stale:
        print("CRDs and reference are up to date")
        return 0
    for diff in stale.values():
        sys.stdout.write(diff)
    names = ", ".join(str(path) for path in stale)
    print(
        f"\nstale: {names}\nrun `chunkpilot crds generate && chunkpilot crds docs` and commit the result",
        file=sys.stderr,
    )
    return 1


def _validate(args: argparse.Namespace) -> int:
    failures = 0
    for path in args.files:
        try:
            for document in iter_documents(path):
                name = (document.get("metadata") or {}).get("name", "?")
                try:
                    validate_document(document)
                except ManifestError as error:
                    failures += 1
                    print(f"{path}: {document.get('kind')}/{name}: {error}", file=sys.stderr)
                else:
                    print(f"{path}: {document.get('kind')}/{name}: valid")
        except (OSError, yaml.YAMLError) as error:
            failures += 1
            print(f"{path}: cannot read: {error}", file=sys.stderr)
    return 1 if failures else 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``chunkpilot crds``."""
    parser = subparsers.add_parser("crds", help="generate, check and document the CustomResourceDefinitions")
    commands = parser.add_subparsers(dest="crds_command", metavar="SUBCOMMAND", required=True)

    generate = commands.add_parser("generate", help="write the CRD YAML generated from chunkpilot.api")
    generate.add_argument("--out", type=Path, help="output directory (default: crds/ of the repository)")
    generate.set_defaults(func=_generate)

    check = commands.add_parser("check", help="exit 1 with a diff when crds/ or the reference are stale")
    check.add_argument("--dir", type=Path, help="CRD directory (default: crds/ of the repository)")
    check.add_argument("--docs", type=Path, help=f"reference file (default: {DOCS_FILE})")
    check.add_argument("--no-docs", action="store_true", help="check the CRDs only")
    check.set_defaults(func=_check)

    docs = commands.add_parser("docs", help="write the Markdown CRD reference")
    docs.add_argument("--out", type=Path, help=f"output file (default: {DOCS_FILE} of the repository)")
    docs.set_defaults(func=_docs)

    validate = commands.add_parser("validate", help="validate manifests with the API model (no cluster)")
    validate.add_argument("files", nargs="+", type=Path, metavar="FILE")
    validate.set_defaults(func=_validate)
