"""A program's LLVM module cut into modules LLVM compiles apart (on other
processes: workers.py), whose objects link back together in the JIT.

Each kernel is a function of its own (codegen.py), so it moves with the
functions it calls. A function called across modules loses `internal` linkage,
takes the module's digest into its name and is declared where called. Only
the program's own functions move (no two clusters' objects define one
symbol), never the entry, and none that reads a global the module defines.
"""
import hashlib
import re

# A global's name as llvmlite's IR printer writes it: always quoted (the
# module text parsed here is that printer's, never llvm.binding's).
_NAME = re.compile(r'@"?([^"(\s]+)"?')


# LLVM's fixed time per function, in characters of its text (the rest grows with
# its length; reports/tuning-measurements.md).
FUNCTION_COST = 10_000


def top_level(text):
    """(function name -> its definition, in order; the module's other lines)
    of LLVM IR text as llvmlite prints it (a definition ends at a line "}").
    explain()'s listings of the kernels come from it too (codegen.py)."""
    definitions, others, name, lines = {}, [], None, []
    for line in text.splitlines():
        if name is None and line.startswith("define "):
            name, lines = _NAME.search(line[line.index("@"):]).group(1), []
        if name is None:
            others.append(line)
            continue
        lines.append(line)
        if line == "}":
            definitions[name] = "\n".join(lines)
            name = None
    return definitions, others


def _calls(definition):
    """The names a definition's body refers to."""
    return set(_NAME.findall(definition.split("\n", 1)[1]))


def _declaration(definition):
    """`declare` for a definition's header (its linkage and the attributes
    after its parameters dropped)."""
    header = re.sub(r"^define (internal )?", "declare ", definition.split("\n", 1)[0])
    return re.sub(r"\)[^)]*$", ")", header)


def _groups(calls, movable):
    """The movable functions in groups that call one another (union-find)."""
    parent = {n: n for n in movable}

    def root(n):
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n
    for n in movable:
        for m in calls[n] & movable:
            parent[root(m)] = root(n)
    groups = {}
    for n in movable:
        groups.setdefault(root(n), []).append(n)
    return list(groups.values())


def split_module(text, prefix, entry, parts):
    """`text` as at most `parts` module texts, the first holding function
    `entry`; functions named `prefix`... may go to the others, balanced by
    their estimated cost to LLVM."""
    definitions, others = top_level(text)
    defined_globals = {m.group(1) for line in others
                       if (m := re.match(r'@"?([^"\s]+)"? = (?!external)', line))}
    calls = {n: _calls(d) for n, d in definitions.items()}
    movable = {n for n in definitions
               if n != entry and n.startswith(prefix) and not calls[n] & defined_globals}
    while stuck := {n for n in movable if calls[n] & definitions.keys() - movable}:
        movable -= stuck          # (it calls a function that stays)
    groups = _groups(calls, movable)
    if parts < 2 or not groups:
        return [text]
    # Largest group first onto the lightest part; the first part starts with
    # what cannot move.
    def cost(names):
        return sum(FUNCTION_COST + len(definitions[n]) for n in names)
    loads = [cost(n for n in definitions if n not in movable)] + [0] * (parts - 1)
    part_of = {}
    for group in sorted(groups, key=cost, reverse=True):
        p = loads.index(min(loads))
        loads[p] += cost(group)
        part_of.update(dict.fromkeys(group, p))
    members = [[n for n in definitions if part_of.get(n, 0) == p] for p in range(parts)]
    members = [names for names in members if names]
    outside = [{m for n in names for m in calls[n] if m in definitions} - set(names)
               for names in members]
    exported = set().union(*outside)
    header = [line for line in others if not line.startswith("@") or " = external " in line]
    texts = []
    for i, (names, calls) in enumerate(zip(members, outside)):
        body = [re.sub(r"^define internal ", "define ", definitions[n], count=1)
                if n in exported else definitions[n] for n in names]
        texts.append("\n".join((others if i == 0 else header)
                               + [_declaration(definitions[n]) for n in sorted(calls)]
                               + body) + "\n")
    if not exported:
        return texts
    # An exported name carries a digest of the module: the JIT resolves a
    # call by name, so a module compiled again differently (the same HLO
    # under other settings) must not reach the functions of the first.
    tag = hashlib.sha256(text.encode()).hexdigest()[:16]
    renamed = re.compile("|".join(re.escape(f'@"{n}"') for n in sorted(exported)))
    return [renamed.sub(lambda m: f'{m.group(0)[:-1]}.{tag}"', t) for t in texts]
