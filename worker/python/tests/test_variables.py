"""Tests for worker/python/variables.py through the runner: a session's variable listing,
bounded, and blind to whatever user objects do when looked at."""

import signal
import sys
import time

import pytest

from runner_modules import job


@pytest.fixture(autouse=True)
def variables(runner, monkeypatch):
    """The listing's module as the runner imports it, with time enough to describe what the
    tests leave (huge values, on a busy machine: no test here is about speed but the one
    that sets the limits back), and its memory of slow types cleared."""
    module = sys.modules["_snakecage_variables"]
    monkeypatch.setattr(module, "VARIABLE_SECONDS", 30.0)
    monkeypatch.setattr(module, "LISTING_SECONDS", 60.0)
    yield module
    module._slow_types.clear()


def listed(session):
    return {v["name"]: v for v in session.variables()[0]}


def run(session, code):
    result = session.run(job(code))
    assert result["exit_code"] == 0, result
    return session._module.__dict__




def test_session_variables_list_names_types_and_shapes(runner, capsys):
    pytest.importorskip("pandas")
    session = runner.Session()
    code = (
        "import numpy as np, pandas as pd\n"
        "x = 42\n"
        "name = 'y' * 500\n"
        "arr = np.zeros((3, 4))\n"
        "df = pd.DataFrame({'a': range(10)})\n"
        "_hidden = 1\n"
        "class Loud:\n"
        "    def __repr__(self):\n        raise SystemExit('repr was called')\n"
        "loud = Loud()\n"
        "items = [1, loud]\n"
    )
    assert session.run(job(code))["exit_code"] == 0
    entries, total = session.variables()
    listing = {v["name"]: v for v in entries}
    assert total == len(entries) == 9  # np, pd, x, name, arr, df, Loud, loud, items
    assert listing["x"] == {"name": "x", "type": "int", "repr": "42"}
    assert listing["name"]["type"] == "str" and len(listing["name"]["repr"]) <= 100
    assert listing["arr"]["shape"] == [3, 4] and listing["arr"]["type"] == "ndarray"
    assert listing["df"]["shape"] == [10, 1] and listing["df"]["type"] == "DataFrame"
    assert listing["np"]["type"] == "module"
    assert listing["loud"]["repr"] == "<__main__.Loud object>"
    assert listing["items"]["repr"] == "[1, <__main__.Loud object>]"
    assert "_hidden" not in listing and "__name__" not in listing


def test_a_names_str_methods_and_a_values_class_property_are_never_called(runner, capsys):
    session = runner.Session()
    code = (
        "hits = []\n"
        "class Nom(str):\n"
        "    def startswith(self, *a):\n        hits.append('startswith')\n"
        "    def __str__(self):\n        hits.append('__str__')\n        return 'str'\n"
        "globals()[Nom('nommé')] = 1\n"
        "globals()[Nom('_caché')] = 2\n"
        "class Piège:\n"
        "    @property\n"
        "    def __class__(self):\n        hits.append('__class__')\n        return int\n"
        "piège = Piège()\n"
        "après = 'ok'\n"
    )
    namespace = run(session, code)
    listing = listed(session)
    assert namespace["hits"] == []
    assert listing["nommé"] == {"name": "nommé", "type": "int", "repr": "1"}
    assert type(listing["nommé"]["name"]) is str
    assert "_caché" not in listing
    assert listing["piège"] == {"name": "piège", "type": "Piège", "repr": "<__main__.Piège object>"}
    assert listing["après"]["repr"] == "'ok'"


def test_a_value_whose_description_raises_is_listed_without_one(runner, variables, monkeypatch):
    session = runner.Session()
    run(session, "class Bad:\n    pass\navant = 1\nbad = Bad()\naprès = 2\n")
    describe = variables.describe

    def failing(name, value, known):
        if name == "bad":
            raise RecursionError("deep")
        return describe(name, value, known)

    monkeypatch.setattr(variables, "describe", failing)
    listing = listed(session)
    assert listing["bad"] == {"name": "bad", "type": "Bad", "repr": "<not described: RecursionError>"}
    assert listing["avant"]["repr"] == "1" and listing["après"]["repr"] == "2"


def test_a_slow_description_is_cut_short_and_its_type_skipped_later(runner, variables, monkeypatch):
    session = runner.Session()
    run(session, "class Lent:\n    pass\navant = 'à'\nlent = Lent()\naprès = 'ok'\n")
    describe = variables.describe
    slow = []

    def sleeping(name, value, known):
        if name == "lent":
            slow.append(name)
            try:
                time.sleep(30)
            except BaseException:
                time.sleep(30)  # the timer repeats: a caught first alarm does not hold it
        return describe(name, value, known)

    monkeypatch.setattr(variables, "describe", sleeping)
    monkeypatch.setattr(variables, "VARIABLE_SECONDS", 0.1)
    monkeypatch.setattr(variables, "LISTING_SECONDS", 1.0)
    started = time.monotonic()
    entries, total = session.variables()
    first = time.monotonic() - started
    listing = {v["name"]: v for v in entries}
    assert total == 4 and set(listing) == {"Lent", "avant", "lent", "après"}
    assert listing["lent"] == {"name": "lent", "type": "Lent", "repr": "<not described: too slow to describe>"}
    assert listing["après"]["repr"] == "'ok'" and listing["avant"]["repr"] == "'à'"
    assert first < 10, first  # not the 30 s it sleeps (a bound, not a timing)
    # Its type is remembered: the next listing does not wait for it again.
    assert listed(session)["lent"]["repr"] == "<not described: too slow to describe>"
    assert slow == ["lent"]
    # The timer and handler are put back as they were.
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)


def test_every_user_global_is_counted_past_the_listing_bound(runner, capsys):
    variables = sys.modules["_snakecage_variables"]
    session = runner.Session()
    code = "g = globals()\nfor i in range(1200):\n    g[f'v{i}é'] = i\n"
    assert session.run(job(code))["exit_code"] == 0
    entries, total = session.variables()
    assert len(entries) == variables.MAX_VARIABLES == 500
    assert total == 1202  # v0é… v1199é, g and i


def test_session_reset_empties_the_listing(runner, capsys):
    session = runner.Session()
    session.run(job("x = 1"))
    session.reset()
    assert session.variables() == ([], 0)




# --------------------------------------------------------------------------
# Hostile objects: each records in ``hits`` any of its code the listing runs.

HITS = "hits = []\n"


def test_a_metaclass_name_property_is_never_read(runner, capsys):
    session = runner.Session()
    code = HITS + (
        "class Meta(type):\n"
        "    @property\n"
        "    def __name__(cls):\n        hits.append('__name__')\n        return 12345\n"
        "    def __eq__(cls, other):\n        hits.append('__eq__')\n        raise ValueError\n"
        "    def __hash__(cls):\n        hits.append('__hash__')\n        raise ValueError\n"
        "    def __len__(cls):\n        hits.append('__len__')\n        raise ValueError\n"
        "class Odd(metaclass=Meta):\n    pass\n"
        "odd = Odd()\n"
        "odds = [odd, Odd]\n"
    )
    namespace = run(session, code)
    listing = listed(session)
    assert namespace["hits"] == []
    assert listing["odd"] == {"name": "odd", "type": "Odd", "repr": "<__main__.Odd object>"}
    assert listing["Odd"] == {"name": "Odd", "type": "Meta", "repr": "<class '__main__.Odd'>"}
    assert listing["odds"]["repr"] == "[<__main__.Odd object>, <class '__main__.Odd'>]"
    assert capsys.readouterr().out == ""


def test_a_class_named_like_a_builtin_keeps_its_repr_to_itself(runner, capsys):
    session = runner.Session()
    code = (
        "class int(int):\n"
        "    def __repr__(self):\n"
        "        global calls\n"
        "        calls = calls + 1\n"
        "        print('user __repr__ ran', flush=True)\n"
        "        return 'user repr'\n"
        "class list(list):\n"
        "    def __repr__(self):\n        global calls\n        calls += 1\n        return 'L'\n"
        "calls = 0\n"
        "n = int(5)\n"
        "items = [n, list([1])]\n"
    )
    namespace = run(session, code)
    capsys.readouterr()
    listing = listed(session)
    assert namespace["calls"] == 0
    assert capsys.readouterr().out == ""
    assert listing["n"] == {"name": "n", "type": "int", "repr": "<__main__.int object>"}
    assert listing["items"]["repr"] == "[<__main__.int object>, <__main__.list object>]"


def test_a_lying_class_and_a_lying_container_are_only_named(runner, capsys):
    session = runner.Session()
    code = HITS + (
        "class Liar:\n"
        "    @property\n"
        "    def __class__(self):\n        hits.append('__class__')\n        return dict\n"
        "    def __getattr__(self, name):\n        hits.append(name)\n        raise AttributeError(name)\n"
        "class Keys(dict):\n"
        "    def __iter__(self):\n        hits.append('__iter__')\n        return iter(())\n"
        "    def keys(self):\n        hits.append('keys')\n        return []\n"
        "    def items(self):\n        hits.append('items')\n        return []\n"
        "    def __len__(self):\n        hits.append('__len__')\n        return 10**9\n"
        "class Row(list):\n"
        "    def __getitem__(self, i):\n        hits.append('__getitem__')\n        raise IndexError\n"
        "import types\n"
        "class Mod(types.ModuleType):\n"
        "    def __getattr__(self, name):\n        hits.append(name)\n        raise AttributeError(name)\n"
        "liar = Liar()\n"
        "keys = Keys(a=1)\n"
        "row = Row([1, 2])\n"
        "mod = Mod('mod')\n"
        "plain = {'k': keys, 'r': row, 'l': liar}\n"
    )
    namespace = run(session, code)
    listing = listed(session)
    assert namespace["hits"] == []
    assert listing["liar"] == {"name": "liar", "type": "Liar", "repr": "<__main__.Liar object>"}
    assert listing["keys"] == {"name": "keys", "type": "Keys", "repr": "<__main__.Keys object>"}
    assert listing["row"]["repr"] == "<__main__.Row object>"
    assert listing["mod"] == {"name": "mod", "type": "Mod", "repr": "<__main__.Mod object>"}
    assert listing["plain"]["repr"] == (
        "{'k': <__main__.Keys object>, 'r': <__main__.Row object>, 'l': <__main__.Liar object>}"
    )


def test_keys_and_members_whose_eq_and_hash_raise_are_shown_without_calling_them(runner, capsys):
    session = runner.Session()
    code = HITS + (
        "class Touchy:\n"
        "    def __hash__(self):\n"
        "        hits.append('__hash__')\n"
        "        return hash('__module__')\n"
        "    def __eq__(self, other):\n"
        "        hits.append('__eq__')\n"
        "        if armed:\n            raise ValueError\n"
        "        return self is other\n"
        "    def __lt__(self, other):\n        hits.append('__lt__')\n        raise ValueError\n"
        "armed = False\n"
        "t = Touchy()\n"
        "as_keys = {t: 1, Touchy(): 2}\n"
        "as_members = {t, Touchy()}\n"
        "frozen = frozenset([t])\n"
        "class Crowded:\n"
        "    locals()[t] = 'a key of the class namespace whose hash is that of __module__'\n"
        "crowded = Crowded()\n"
        "globals()[t] = 'a global that is not named by a str'\n"
        "hits.clear()\n"
        "armed = True\n"
    )
    namespace = run(session, code)
    entries, total = session.variables()
    listing = {v["name"]: v for v in entries}
    assert namespace["hits"] == []
    assert listing["as_keys"]["repr"] == (
        "{<__main__.Touchy object>: 1, <__main__.Touchy object>: 2}"
    )
    assert listing["as_members"]["repr"] == "{<__main__.Touchy object>, <__main__.Touchy object>}"
    assert listing["frozen"]["repr"] == "frozenset({<__main__.Touchy object>})"
    assert listing["crowded"]["type"] == "Crowded"
    assert listing["crowded"]["repr"].endswith("Crowded object>")
    assert total == len(entries) == 9  # hits, Touchy, armed, t, as_keys, as_members, frozen, Crowded, crowded


def test_recursive_and_deep_values_are_cut_at_a_depth(runner, capsys):
    session = runner.Session()
    code = (
        "loop = [1]\nloop.append(loop)\n"
        "cycle = {}\ncycle['me'] = cycle\n"
        "deep = []\nfor _ in range(100_000):\n    deep = [deep]\n"
        "huge = 10 ** 100_000\n"
        "text = 'é' * 1_000_000\n"
        "blob = b'x' * 1_000_000\n"
        "many = list(range(10**6))\n"
    )
    run(session, code)
    listing = listed(session)
    assert listing["loop"]["repr"] == "[1, [1, [1, […]]]]"
    assert listing["cycle"]["repr"] == "{'me': {'me': {'me': {…}}}}"
    assert listing["deep"]["repr"] == "[[[[…]]]]"
    assert listing["huge"]["repr"] == "<int of 332193 bits>"
    assert listing["text"]["repr"] == "'" + "é" * 60 + "'…"
    assert listing["blob"]["repr"] == "b'" + "x" * 60 + "'…"
    assert listing["many"]["repr"] == "[0, 1, 2, 3, 4, 5, …]"


def test_names_and_type_names_are_cut(runner, variables, capsys):
    session = runner.Session()
    code = (
        "class Meta(type):\n"
        "    @property\n"
        "    def __name__(cls):\n        return 'M' * 5_000_000\n"
        "Named = Meta('N' * 5_000_000, (), {})\n"
        "named = Named()\n"
        "globals()['v' * 1_000_000] = 1\n"
    )
    run(session, code)
    entries, total = session.variables()
    listing = {v["name"]: v for v in entries}
    assert listing["named"]["type"] == "N" * 99 + "…"
    assert listing["named"]["repr"] == "<__main__." + "N" * 89 + "…"
    assert listing["v" * 99 + "…"]["repr"] == "1"
    assert all(len(v["name"]) <= variables.NAME_CHARS for v in entries)
    assert all(len(v["type"]) <= variables.TYPE_CHARS for v in entries)
    assert all(len(v["repr"]) <= variables.REPR_CHARS for v in entries)


def test_the_listing_stops_at_its_size_in_characters_and_counts_the_rest(runner, variables):
    session = runner.Session()
    code = "g = globals()\nfor i in range(450):\n    g[f'{i:03}' + 'n' * 1_000_000] = 'v' * 1_000_000\n"
    run(session, code)
    entries, total = session.variables()
    assert total == 452  # 450 long names, g and i
    size = sum(len(v["name"]) + len(v["type"]) + len(v["repr"]) for v in entries)
    assert size <= variables.LISTING_CHARS
    # Each long entry takes 100 + 3 + 63 characters: the listing ends where the next would
    # not fit, well before MAX_VARIABLES.
    assert entries[-1]["name"].endswith("n…") and len(entries[-1]["repr"]) == 63
    assert size + 166 > variables.LISTING_CHARS
    assert len(entries) < 450


def test_imported_modules_are_scanned_not_looked_up(runner, capsys):
    pytest.importorskip("numpy")
    session = runner.Session()
    # A key whose hash is that of "pandas" put in sys.modules before "pandas": a lookup of
    # "pandas" would compare it (its ``__eq__``) first.
    code = HITS + (
        "import sys, types, numpy\n"
        "class Collides:\n"
        "    def __hash__(self):\n        return hash('pandas')\n"
        "    def __eq__(self, other):\n        hits.append('__eq__')\n        return False\n"
        "class Fake(types.ModuleType):\n"
        "    def __getattr__(self, name):\n        hits.append(name)\n        raise AttributeError(name)\n"
        "saved = sys.modules.pop('pandas', None)\n"
        "key = Collides()\n"
        "sys.modules[key] = None\n"
        "sys.modules['pandas'] = Fake('pandas')\n"
        "arr = numpy.zeros((2, 3))\n"
    )
    try:
        namespace = run(session, code)
        namespace["hits"].clear()  # the job's own imports looked modules up: not the listing
        listing = listed(session)
        hits = list(namespace["hits"])
    finally:
        namespace = session._module.__dict__
        del sys.modules[namespace["key"]]
        sys.modules.pop("pandas", None)
        if namespace.get("saved") is not None:
            sys.modules["pandas"] = namespace["saved"]
    assert hits == []
    assert listing["arr"]["shape"] == [2, 3]
    assert listing["arr"]["repr"] == "ndarray of shape (2, 3), dtype float64"
    assert listing["key"]["repr"] == "<__main__.Collides object>"
