"""Bug kinds: each draws one small, correct function (with its tests) and the one-line bug.

A kind is a function `(rng, noun) -> Snippet`. The snippet's code is correct; `wrong` is the line
that replaces `right` to plant the bug. `keeps` are checks that pass with and without the bug
(PASS_TO_PASS), `breaks` pass only without it (FAIL_TO_PASS). `example` is a call whose value
the problem statement quotes (computed by running both versions, so the statement never lies)
and `rule` is the sentence that says how the function should behave, so the fix follows from
the statement plus the file: a small model that reads the file can find the line to change.

Every name is built from the noun (see `names`), never used bare, so held-out names stay
held out.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["KINDS", "Check", "Snippet"]


@dataclass(frozen=True)
class Check:
    """One test function: `def {name}():` followed by `body` (already indented)."""

    name: str
    body: str

    def source(self) -> str:
        return f"def {self.name}():\n{self.body}\n"


@dataclass(frozen=True)
class Snippet:
    kind: str
    code: str  # correct code: optional constant, then one or two functions
    right: str  # the line as it should be; occurs exactly once in `code`
    wrong: str  # the buggy line
    function: str  # the function whose behaviour the statement describes
    exports: tuple[str, ...]  # names the tests import
    keeps: tuple[Check, ...]
    breaks: tuple[Check, ...]
    example: str  # a call expression quoted in the statement
    rule: str  # how the function should behave, in one sentence

    @property
    def buggy_code(self) -> str:
        assert self.code.count(self.right) == 1, (self.kind, self.right)
        return self.code.replace(self.right, self.wrong)


Kind = Callable[[random.Random, str], Snippet]


def _assert(expression: str, expected: object) -> str:
    return f"    assert {expression} == {expected!r}"


def _a(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def _other(rng: random.Random, good: int, choices: list[int]) -> int:
    return rng.choice([c for c in choices if c != good and c > 0])


def wrong_constant(rng: random.Random, noun: str) -> Snippet:
    attr, word = rng.choice(
        [("RATE", "rate"), ("PRICE", "price"), ("FEE", "fee"), ("POINTS", "points"),
         ("WEIGHT", "weight"), ("COST", "cost")]
    )
    verb = rng.choice(["price", "cost", "score", "total"])
    const, fn, arg = f"{noun.upper()}_{attr}", f"{verb}_{noun}", f"{noun}_count"
    good = rng.randint(3, 12)
    bad = _other(rng, good, [good - 1, good + 1, good * 2, good + 10])
    code = (
        f"{const} = {good}\n\n\n"
        f"def {fn}({arg}):\n"
        f'    """The {word} of `{arg}` items."""\n'
        f"    return {arg} * {const}\n"
    )
    x = rng.randint(2, 9)
    return Snippet(
        "wrong_constant", code, f"{const} = {good}", f"{const} = {bad}", fn, (fn,),
        keeps=(Check(f"test_{fn}_of_nothing", _assert(f"{fn}(0)", 0)),),
        breaks=(Check(f"test_{fn}_per_item", _assert(f"{fn}({x})", x * good) + "\n"
                      + _assert(f"{fn}(1)", good)),),
        example=f"{fn}({x})",
        rule=f"The {word} is {good} per item.",
    )


def wrong_comparison(rng: random.Random, noun: str) -> Snippet:
    limit = rng.randint(5, 60)
    fn, arg = f"{rng.choice(['accepts', 'allows', 'admits', 'fits'])}_{noun}", f"{noun}_size"
    variant = rng.choice(["at_least", "at_most", "above"])
    exact = f"{_a(noun).capitalize()} of exactly {limit} is accepted."
    if variant == "at_least":
        const, right_op, wrong_op = f"{noun.upper()}_MIN", ">=", ">"
        rule, edge, inside, outside = exact, True, limit + 3, limit - 3
    elif variant == "at_most":
        const, right_op, wrong_op = f"{noun.upper()}_MAX", "<=", "<"
        rule, edge, inside, outside = exact, True, limit - 3, limit + 3
    else:
        const, right_op, wrong_op = f"{noun.upper()}_LIMIT", ">", ">="
        rule = f"Only sizes above {limit} are accepted; exactly {limit} is not."
        edge, inside, outside = False, limit + 3, limit - 3
    code = (
        f"{const} = {limit}\n\n\n"
        f"def {fn}({arg}):\n"
        f'    """Whether {_a(noun)} of size `{arg}` is accepted."""\n'
        f"    return {arg} {right_op} {const}\n"
    )
    return Snippet(
        "wrong_comparison", code, f"    return {arg} {right_op} {const}",
        f"    return {arg} {wrong_op} {const}", fn, (fn,),
        keeps=(Check(f"test_{fn}_far_from_the_limit", _assert(f"{fn}({inside})", True) + "\n"
                     + _assert(f"{fn}({outside})", False)),),
        breaks=(Check(f"test_{fn}_at_the_limit", _assert(f"{fn}({limit})", edge)),),
        example=f"{fn}({limit})",
        rule=rule,
    )


def off_by_one(rng: random.Random, noun: str) -> Snippet:
    variant = rng.choice(["range", "slice", "last"])
    if variant == "range":
        fn, arg, acc, step = f"sum_{noun}", f"{noun}_top", f"{noun}_total", f"{noun}_step"
        code = (
            f"def {fn}({arg}):\n"
            f'    """1 + 2 + ... + `{arg}`."""\n'
            f"    {acc} = 0\n"
            f"    for {step} in range(1, {arg} + 1):\n"
            f"        {acc} += {step}\n"
            f"    return {acc}\n"
        )
        right, wrong = f"range(1, {arg} + 1)", f"range(1, {arg})"
        n = rng.randint(3, 9)
        return Snippet(
            "off_by_one", code, right, wrong, fn, (fn,),
            keeps=(Check(f"test_{fn}_of_zero", _assert(f"{fn}(0)", 0)),),
            breaks=(Check(f"test_{fn}_includes_the_top", _assert(f"{fn}({n})", n * (n + 1) // 2)
                          + "\n" + _assert(f"{fn}(1)", 1)),),
            example=f"{fn}({n})",
            rule=f"The sum includes `{arg}` itself.",
        )
    if variant == "slice":
        fn, items, count = f"first_{noun}", f"{noun}_list", f"{noun}_count"
        code = (
            f"def {fn}({items}, {count}):\n"
            f'    """The first `{count}` items of `{items}`."""\n'
            f"    return {items}[:{count}]\n"
        )
        k = rng.randint(2, 4)
        values = list(range(1, k + 3))
        return Snippet(
            "off_by_one", code, f"    return {items}[:{count}]",
            f"    return {items}[:{count} - 1]",
            fn, (fn,),
            keeps=(Check(f"test_{fn}_of_an_empty_list", _assert(f"{fn}([], {k})", [])),),
            breaks=(Check(f"test_{fn}_keeps_that_many",
                          _assert(f"{fn}({values}, {k})", values[:k])),),
            example=f"{fn}({values}, {k})",
            rule=f"It returns exactly `{count}` items.",
        )
    fn, items = f"last_{noun}", f"{noun}_list"
    code = (
        f"def {fn}({items}):\n"
        f'    """The last item of `{items}`."""\n'
        f"    return {items}[len({items}) - 1]\n"
    )
    values = rng.sample(range(10, 99), rng.randint(3, 5))
    return Snippet(
        "off_by_one", code, f"[len({items}) - 1]", f"[len({items}) - 2]", fn, (fn,),
        keeps=(Check(f"test_{fn}_of_a_pair_of_equals", _assert(f"{fn}([7, 7])", 7)),),
        breaks=(Check(f"test_{fn}_is_the_last", _assert(f"{fn}({values})", values[-1])),),
        example=f"{fn}({values})",
        rule="It returns the last item.",
    )


def _typo(rng: random.Random, word: str) -> str:
    i = rng.randint(1, len(word) - 2)
    if word[i] != word[i + 1] and rng.random() < 0.5:
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]  # two letters swapped
    return word[:i] + word[i + 1 :]  # one letter dropped


def wrong_string(rng: random.Random, noun: str) -> Snippet:
    fn, arg = f"label_{noun}", f"{noun}_name"
    word = noun.capitalize()
    bad = _typo(rng, word)
    sep = rng.choice([": ", " - ", " #"])
    code = (
        f"def {fn}({arg}):\n"
        f'    """The label shown for one {noun}."""\n'
        f'    return "{word}{sep}" + {arg}\n'
    )
    name = rng.choice(["red", "big", "old", "new", "one"])
    return Snippet(
        "wrong_string", code, f'"{word}{sep}"', f'"{bad}{sep}"', fn, (fn,),
        keeps=(Check(f"test_{fn}_ends_with_the_name",
                     f"    assert {fn}({name!r}).endswith({name!r})"),),
        breaks=(Check(f"test_{fn}_text", _assert(f"{fn}({name!r})", f"{word}{sep}{name}")),),
        example=f"{fn}({name!r})",
        rule=f"The label starts with `{word}{sep}`.",
    )


def swapped_arguments(rng: random.Random, noun: str) -> Snippet:
    helper, a, b = f"{noun}_gap", f"{noun}_high", f"{noun}_low"
    verb = rng.choice(["extra", "excess", "surplus"])
    fn, x, y = f"{verb}_{noun}", f"{noun}_have", f"{noun}_need"
    code = (
        f"def {helper}({a}, {b}):\n"
        f"    return {a} - {b}\n\n\n"
        f"def {fn}({x}, {y}):\n"
        f'    """How many more than `{y}` we have."""\n'
        f"    return {helper}({x}, {y})\n"
    )
    have, need = rng.randint(10, 40), rng.randint(1, 9)
    return Snippet(
        "swapped_arguments", code, f"    return {helper}({x}, {y})",
        f"    return {helper}({y}, {x})",
        fn, (fn, helper),
        keeps=(Check(f"test_{fn}_of_equals", _assert(f"{fn}(4, 4)", 0)),
               Check(f"test_{helper}", _assert(f"{helper}(9, 2)", 7))),
        breaks=(Check(f"test_{fn}_is_positive", _assert(f"{fn}({have}, {need})", have - need)),),
        example=f"{fn}({have}, {need})",
        rule=f"`{fn}(have, need)` is `have - need`.",
    )


def wrong_operator(rng: random.Random, noun: str) -> Snippet:
    if rng.random() < 0.5:
        fn, x, y = f"net_{noun}", f"{noun}_price", f"{noun}_discount"
        right, wrong, doc = f"{x} - {y}", f"{x} + {y}", f"`{x}` after taking off `{y}`."
        a, b = rng.randint(30, 90), rng.randint(2, 20)
        expected, rule, neutral = a - b, "The discount is taken off the price.", 0
    else:
        fn, x, y = f"share_{noun}", f"{noun}_total", f"{noun}_parts"
        right, wrong, doc = f"{x} / {y}", f"{x} * {y}", f"`{x}` split evenly into `{y}` parts."
        b = rng.randint(2, 6)
        a = b * rng.randint(2, 9)
        expected, rule, neutral = a / b, "The total is divided by the number of parts.", 1
    code = (
        f"def {fn}({x}, {y}):\n"
        f'    """{doc}"""\n'
        f"    return {right}\n"
    )
    return Snippet(
        "wrong_operator", code, f"    return {right}", f"    return {wrong}", fn, (fn,),
        keeps=(Check(f"test_{fn}_neutral", _assert(f"{fn}(12, {neutral})", 12)),),
        breaks=(Check(f"test_{fn}_value", _assert(f"{fn}({a}, {b})", expected)),),
        example=f"{fn}({a}, {b})",
        rule=rule,
    )


def wrong_index(rng: random.Random, noun: str) -> Snippet:
    words = rng.sample(["red", "blue", "green", "gold", "gray", "pink", "teal"], 3)
    text = " ".join(words)
    which = rng.choice(["first", "last"])
    if which == "first":
        right, wrong, expected = "[0]", "[1]", words[0]
    else:
        right, wrong, expected = "[-1]", "[0]", words[-1]
    fn, arg = f"{which}_word_{noun}", f"{noun}_text"
    code = (
        f"def {fn}({arg}):\n"
        f'    """The {which} word of `{arg}`."""\n'
        f"    return {arg}.split(){right}\n"
    )
    return Snippet(
        "wrong_index", code, f".split(){right}", f".split(){wrong}", fn, (fn,),
        keeps=(Check(f"test_{fn}_of_a_repeat", _assert(f"{fn}('ok ok')", "ok")),),
        breaks=(Check(f"test_{fn}_picks_the_{which}", _assert(f"{fn}({text!r})", expected)),),
        example=f"{fn}({text!r})",
        rule=f"It returns the {which} word.",
    )


def wrong_default(rng: random.Random, noun: str) -> Snippet:
    fn, items, sep = f"join_{noun}", f"{noun}_parts", f"{noun}_sep"
    good, bad = rng.sample([", ", "-", "/", " | ", ";", "+"], 2)
    code = (
        f'def {fn}({items}, {sep}="{good}"):\n'
        f'    """`{items}` joined by `{sep}`."""\n'
        f"    return {sep}.join({items})\n"
    )
    parts = rng.sample(["a", "b", "c", "x", "y"], 2)
    return Snippet(
        "wrong_default", code, f'{sep}="{good}"', f'{sep}="{bad}"', fn, (fn,),
        keeps=(Check(f"test_{fn}_with_a_separator",
                     _assert(f"{fn}({parts}, '.')", ".".join(parts))),),
        breaks=(Check(f"test_{fn}_by_default", _assert(f"{fn}({parts})", good.join(parts))),),
        example=f"{fn}({parts})",
        rule=f"The default separator is {good!r}.",
    )


def negated_condition(rng: random.Random, noun: str) -> Snippet:
    fn, arg = f"is_{noun}_code", f"{noun}_code"
    prefix = f"{noun[:3].upper()}-"
    code = (
        f"def {fn}({arg}):\n"
        f'    """Whether `{arg}` is {_a(noun)} code (it starts with "{prefix}")."""\n'
        f'    return {arg}.startswith("{prefix}")\n'
    )
    number = rng.randint(10, 999)
    return Snippet(
        "negated_condition", code, f'    return {arg}.startswith("{prefix}")',
        f'    return not {arg}.startswith("{prefix}")', fn, (fn,),
        keeps=(),
        breaks=(Check(f"test_{fn}_yes", _assert(f"{fn}('{prefix}{number}')", True)),
                Check(f"test_{fn}_no", _assert(f"{fn}('X-{number}')", False))),
        example=f"{fn}('{prefix}{number}')",
        rule=f"Codes that start with {prefix!r} are {noun} codes.",
    )


def wrong_rounding(rng: random.Random, noun: str) -> Snippet:
    fn, x, y = f"average_{noun}", f"{noun}_sum", f"{noun}_n"
    digits = rng.choice([1, 2, 3])
    bad = rng.choice([d for d in (0, 1, 2, 3) if d != digits])
    code = (
        f"def {fn}({x}, {y}):\n"
        f'    """The mean, rounded."""\n'
        f"    return round({x} / {y}, {digits})\n"
    )
    a, b = rng.choice([(10, 3), (20, 3), (7, 6), (5, 7), (22, 7), (1, 3), (2, 3), (11, 6)])
    return Snippet(
        "wrong_rounding", code, f"round({x} / {y}, {digits})", f"round({x} / {y}, {bad})",
        fn, (fn,),
        keeps=(Check(f"test_{fn}_exact", _assert(f"{fn}(8, 2)", 4)),),
        breaks=(Check(f"test_{fn}_digits", _assert(f"{fn}({a}, {b})", round(a / b, digits))),),
        example=f"{fn}({a}, {b})",
        rule=f"The result is rounded to {digits} decimal place{'s' if digits > 1 else ''}.",
    )


KINDS: dict[str, Kind] = {
    kind.__name__: kind
    for kind in (wrong_constant, wrong_comparison, off_by_one, wrong_string, swapped_arguments,
                 wrong_operator, wrong_index, wrong_default, negated_condition, wrong_rounding)
}
