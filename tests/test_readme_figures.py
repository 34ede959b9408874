"""Every measured figure in README.md and docs/*.md comes from a committed results file.

A figure is a decimal number in the prose or tables (`6.87`, `0.51×`, `73.0 %`), or a whole
number with a unit of time, rate or ratio (`592 ms`, `8 s`); numbers in code are not figures.
Each must be found in a results file under `benchmarks/results/` that the same section of the
document names (`benchmarks/results/NAME`), equal at the precision it is printed with (a
percentage may be a fraction in the file). Settings and inputs that look like figures (a
timeout, a limit) are listed in NOT_MEASURED with the reason; nothing else is exempt.
"""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
UNIT = r"\s?(?:ms|s|min|h|%|×|x|steps/h|calls/s|tok/s|core-seconds)(?![\w/])"
# A decimal, or a number with a unit; not part of a version (1.16.0), a name (v0, p50, t30)
# or a range's second half (handled as its own number).
FIGURE = re.compile(rf"(?<![\w.\-/])(?:({NUMBER})(?={UNIT})|(\d+\.\d+)(?![\d.]*\w))")
RESULTS_NAME = re.compile(r"benchmarks/results/([\w.\-]+\.(?:json|txt))")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)
SECTION = re.compile(r"^#{1,3} ", re.MULTILINE)

# Phrases whose numbers are settings, inputs or defined values, not measurements: blanked
# before the figures are looked for. Each says why.
NOT_MEASURED: dict[str, str] = {
    "('passed', 0.99)": "the reward the README's example returns: 1 minus the tool penalty",
    "(reward 0.99)": "the same computed reward",
    "logprob 0.0": "the value the trace defines for inserted tokens",
    "0.0 where the mask is 0": "the same defined value",
    "default to 1.0": "a default setting",
    "(reward 0.0,": "a default setting",
    "(900 + 300 + 120 s)": "the default timeouts and margin, settings",
    "every 50 ms": "the disk and tree watchers' period, a setting",
    "(5 s)": "scale-out.md: the default of poll_s, a setting",
    "(30 s)": "scale-out.md: the default of retry_s, a setting",
    "up to 10 min": "scale-out.md: the retry back-off's cap, a setting",
    "defaults to 60 s, 0 means none": "design.md: a job's default timeout, a setting",
    "backoff (0.5, 1, 2, 4 s)": "design.md: the remote sandbox's retry delays, settings",
    "1.5 GiB in one process": "reward-integrity.md: what an attack asks for, an input",
    "copies the fix in every 10 ms": "reward-integrity.md: the attacker's period, an input",
}
# A number right after one of these is a version or an identifier, not a figure.
VERSIONED = re.compile(r"(?:TRL|vLLM|Ray|License|arXiv|Python|Node|torch|Linux)\s$")


def figures(text: str) -> list[tuple[str, str, str]]:
    """(figure, its line, context) for each figure in a markdown text, code left out."""
    prose = CODE.sub(lambda m: " " * len(m.group(0)), text)
    for phrase in NOT_MEASURED:  # as printed, line breaks anywhere between its words
        pattern = r"\s+".join(map(re.escape, phrase.split()))
        prose = re.sub(pattern, lambda m: " " * len(m.group(0)), prose)
    found = []
    for match in FIGURE.finditer(prose):
        if VERSIONED.search(prose[max(0, match.start() - 12):match.start()]):
            continue
        value = match.group(1) or match.group(2)
        line_start = prose.rfind("\n", 0, match.start()) + 1
        line_end = prose.find("\n", match.end())
        line = prose[line_start:line_end if line_end >= 0 else len(prose)]
        start = max(0, match.start() - 40)
        found.append((value, line, " ".join(prose[start:match.end() + 20].split())))
    return found


def results_numbers(name: str) -> list[Decimal]:
    text = (RESULTS / name).read_text()
    found = re.findall(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:e-?\d+)?", text)
    return [Decimal(n.replace(",", "")) for n in found if "e" not in n]


def _quantum(figure: str) -> Decimal:
    return Decimal(1).scaleb(Decimal(figure.replace(",", "")).as_tuple().exponent)


def matches(figure: str, numbers: list[Decimal]) -> bool:
    """The figure is a number of the file at the figure's precision, or that number x 100 (a
    fraction printed as a percentage). Rounded either as the decimal text (half to even) or as
    Python prints the float the text holds: 0.5375 is 0.53749999... as a float, so `:.3f`
    prints 0.537 where the decimal rounds to 0.538."""
    value, quantum = Decimal(figure.replace(",", "")), _quantum(figure)
    places = max(0, -quantum.as_tuple().exponent)

    def printed(n: Decimal) -> Decimal:
        return Decimal(f"{float(n):.{places}f}")

    return any(value in (n.quantize(quantum), (n * 100).quantize(quantum), printed(n),
                         printed(n * 100)) for n in numbers)


def is_ratio_of(figure: str, sourced: list[str]) -> bool:
    """A ratio (`0.51×`) of two sourced figures printed on the same line, within the rounding
    of all three."""
    value, half = Decimal(figure), _quantum(figure) / 2
    for a in sourced:
        for b in sourced:
            (x, hx), (y, hy) = [(Decimal(f.replace(",", "")), _quantum(f) / 2) for f in (a, b)]
            if y - hy > 0 and (x - hx) / (y + hy) - half <= value <= (x + hx) / (y - hy) + half:
                return True
    return False


def sections(path: Path) -> list[str]:
    text = path.read_text()
    starts = [0, *(m.start() for m in SECTION.finditer(text)), len(text)]
    return [text[a:b] for a, b in zip(starts, starts[1:]) if text[a:b].strip()]


def unsourced(path: Path) -> list[str]:
    problems = []
    for section in sections(path):
        named = sorted(set(RESULTS_NAME.findall(section)))
        missing = [n for n in named if not (RESULTS / n).is_file()]
        problems += [f"names benchmarks/results/{n}, which is not committed" for n in missing]
        numbers = [x for n in named if n not in missing for x in results_numbers(n)]
        found = figures(section)
        sourced = {(f, line) for f, line, _ in found if matches(f, numbers)}
        for figure, line, context in found:
            if (figure, line) in sourced:
                continue
            if re.search(rf"(?<![\d.,]){re.escape(figure)}\s?[×x]", line) and is_ratio_of(
                    figure, [f for f, l in sourced if l == line]):
                continue
            where = ", ".join(named) or "no results file named in its section"
            problems.append(f"{figure!r} not in {where}: ...{context}...")
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_figure_comes_from_a_results_file_its_section_names(path: Path):
    problems = unsourced(path)
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)


def test_the_checker_finds_figures_and_tells_a_wrong_one():
    text = ("p50 **6.87** vs 13.41 ms (0.51×), 592 ms, 73.0 % idle, v0.1.0, TRL 1.16, "
            "30 turns, logprob 0.0")
    assert [f for f, _, _ in figures(text)] == ["6.87", "13.41", "0.51", "592", "73.0"]
    numbers = [Decimal("6.8712"), Decimal("0.7298"), Decimal("591.5")]
    assert matches("6.87", numbers) and matches("73.0", numbers) and matches("592", numbers)
    assert not matches("6.88", numbers) and not matches("591.6", numbers)
    assert is_ratio_of("0.51", ["6.87", "13.41"]) and not is_ratio_of("0.52", ["6.87", "13.41"])


def test_the_readme_check_is_not_vacuous_and_catches_an_altered_figure(tmp_path: Path):
    readme = (REPO / "README.md").read_text()
    assert len(figures(readme)) >= 30  # the benchmark table, the async table, the learning curve
    assert "**6.87**" in readme
    altered = tmp_path / "README.md"
    altered.write_text(readme.replace("**6.87**", "**6.78**", 1))
    assert any(p.startswith("'6.78' not in ") for p in unsourced(altered))
