"""What each entity is to its prompt: the main subject, the scene (setting), or a secondary element.

A cache hit borrows from an earlier video only when that video would show the request's main subject or its
setting, so every entity carries a role read from the parse:

- **main**: the grammatical subject of the prompt's first sentence (the subject of its main verb, or the root
  noun of a caption such as "A golden retriever, running on the beach", with what is coordinated with it), and
  the thing a template introduces ("close-up of a cat"); without any of these, the first object mentioned.
  A part stands for its owner ("the face of an old fisherman": the fisherman), and a camera move "from A to B"
  has both ends in its subject ("crane down from a cathedral ceiling to a white cat").
- **scene**: an entity of kind "scene" (a place, a landscape, a setting; see `entities`), wherever it stands.
- **secondary**: everything else (props, background objects, times of day and light).

People named only generically ("a man", "two people") say little on their own: what they do is what a video of
them shows, so such an entity takes its activity into its text ("man playing guitar", "people shaking hand"),
and two generic people match only when they do similar things.
"""
from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from typing import TYPE_CHECKING

from .lexicon import PART_NOUNS, PERSON_ROLES, names_one_of

if TYPE_CHECKING:
    from spacy.tokens import Doc, Token

MAIN, SCENE, SECONDARY = "main", "scene", "secondary"
ROLES = (MAIN, SCENE, SECONDARY)
BORROWABLE = frozenset({MAIN, SCENE})  # roles whose match makes a donor worth borrowing from

# People named without a role: their activity, not the word, tells two videos apart.
GENERIC_PEOPLE = frozenset({
    "person", "people", "man", "men", "woman", "women", "boy", "girl", "child", "children", "kid", "guy", "lady",
    "someone", "somebody", "individual", "human", "adult", "teenager", "teen", "couple", "figure", "crowd",
})
PEOPLE = GENERIC_PEOPLE | PERSON_ROLES  # a person, named generically or by a role
_SUBJECT_DEPS = frozenset({"nsubj", "nsubjpass"})
# "a cup on the left of a plate": both objects are what the picture is about.
_POSITION_WORDS = frozenset({"left", "right", "top", "bottom", "front", "side", "middle", "center", "centre",
                             "back", "next"})
_ACTIVITY_OBJECT_DEPS = frozenset({"dobj", "attr", "pobj"})
_BESIDE_MARKS = frozenset({"while", "as", "when", "whilst"})
# sm's lemmas and tags of these go wrong ("rides" -> "rid"); "mount" is left out ("a TV mounted on the wall")
_RIDE_VERBS = frozenset({"ride", "rides", "riding", "rode", "ridden", "straddle", "straddles", "straddling"})
_MOUNT_PREPOSITIONS = frozenset({"on", "upon", "astride", "atop"})


def focus_tokens(doc: "Doc") -> set[int]:
    """Token indices of the first sentence's subject: root noun (unless a clause with its own subject comes before
    it) or subject of the root, their conjuncts and appositions, and the object of "of" after a root that is no
    entity (a template such as "close-up of")."""
    sent = next(iter(doc.sents), None) if doc.has_annotation("DEP") else None
    if sent is None:
        return set()
    root = sent.root
    focus: set[int] = set()
    # "Mika ... pedals her bicycle through a city, neon signs reflecting in the puddles" (sm: root "signs", the clause
    # before it a ccomp): a noun after a clause that has its own subject is a trailing fragment, not the subject.
    # ("While the city sleeps, a black cat prowling across a rooftop": an adverbial clause leaves the root its role)
    clause_first = any(c.i < root.i and c.dep_ in ("ccomp", "parataxis") and c.pos_ in ("VERB", "AUX")
                       and any(g.dep_ in _SUBJECT_DEPS for g in c.children) for c in root.children)
    if root.pos_ in ("NOUN", "PROPN") and not clause_first:
        focus.add(root.i)
    for tok in sent:
        if tok.dep_ in _SUBJECT_DEPS and tok.head.i == root.i:
            focus.add(tok.i)
    for tok in sent:
        if tok.dep_ == "pobj" and tok.head.lower_ == "of" and tok.head.head.i == root.i:
            focus.add(tok.i)  # candidates; `roles_for` keeps them only when the root itself is no entity
        if tok.dep_ == "pobj" and tok.head.lower_ in ("of", "to") and tok.head.head.lower_ in _POSITION_WORDS:
            focus.add(tok.i)
    for tok in sent:
        # "a busy city street with a red bird travelling left": what acts in a scene described "with" it.
        if (tok.dep_ == "pobj" and tok.head.lower_ == "with" and tok.head.head.i in focus
                and any(c.dep_ in ("acl", "relcl") and c.pos_ == "VERB" for c in tok.children)):
            focus.add(tok.i)
        # "The dense forest, where a green kite is drifting": the subject of a clause about the focus.
        if tok.dep_ in _SUBJECT_DEPS and tok.head.dep_ in ("relcl", "acl") and tok.head.head.i in focus:
            focus.add(tok.i)
        # "The red dragon circles above the castle while the blue-caped knight watches": the subject of a clause
        # happening beside the main one is in the picture as much, when it is a person by role or by name ("as
        # the sun rises", "while people dance in the background", "while the Eiffel Tower glows" stay).
        if (tok.dep_ in _SUBJECT_DEPS and tok.head.dep_ == "advcl" and tok.head.head.i == root.i
                and any(c.dep_ == "mark" and c.lower_ in _BESIDE_MARKS for c in tok.head.children)
                and _named_person(tok) and not any(t.lower_ == "background" for t in tok.head.subtree)):
            focus.add(tok.i)
        # "An old cowboy rides a chestnut horse", "a knight riding on a dragon": the mount is as big as its rider,
        # a person ("a boat rides the waves", "The Titanic rides the waves" keep their objects where they were).
        if tok.lower_ in _RIDE_VERBS and (tok.i == root.i or tok.head.i in focus) and _ridden_by_a_person(tok):
            # "rides down a concrete bowl" (a particle): the object is the way, not the mount
            mounts = [c.i for c in tok.children if c.dep_ == "dobj"] if not any(
                c.dep_ == "prt" for c in tok.children) else []
            for prep in (c for c in tok.children if c.dep_ == "prep" and c.lower_ in _MOUNT_PREPOSITIONS):
                mounts += [] if mounts else [c.i for c in prep.children if c.dep_ == "pobj"]  # not "a horse on Mars"
            focus.update(mounts)
        # "An aging samurai named Kenji": the name is the subject too (a series calls him by it).
        if (tok.dep_ in ("oprd", "attr") and tok.head.lemma_.lower() in ("name", "call")
                and tok.head.dep_ == "acl" and tok.head.head.i in focus):
            focus.add(tok.i)
    grown = True
    while grown:
        grown = False
        for tok in sent:
            if (tok.i not in focus and tok.dep_ in ("conj", "appos") and tok.head.i in focus
                    and not _clause_between(doc, tok.head.i, tok.i)):
                focus.add(tok.i)
                grown = True
    return focus


_NOUN_MODIFIER_DEPS = frozenset({"amod", "compound", "nmod", "nummod", "det", "poss"})
_PLACE_PARTS = frozenset({"surface", "edge", "top", "bottom", "side", "middle", "inside", "interior", "exterior"})


def _absolute_detail(doc: "Doc", i: int, things: Sequence[int]) -> bool:
    """A bare noun after a comma with its own participle, after a thing the sentence names before it (`things`: the
    head tokens of its object entities): a detail of the picture (an absolute clause: "..., raindrops beading on the
    paint", "..., dust swirling around her boots", "..., headlights cutting through fog"), not a second subject. An
    article makes it one ("A cat sleeping on the sofa, a dog playing with a ball"), so do people ("a car on fire,
    firefighters spraying water"), and so does a sentence that names only places, times or the things of a
    preposition before it ("An elegant ballroom with a crystal chandelier, couples waltzing", "Autumn at the
    lakeside cabin, maple trees blazing") or nothing ("Slow motion, petals falling")."""
    tok = doc[i]
    sent = tok.sent
    start = i  # the noun phrase's own first word (a root's subtree spans the sentence)
    while start - 1 > sent.start and doc[start - 1].dep_ in _NOUN_MODIFIER_DEPS and doc[start - 1].head.i >= start:
        start -= 1
    if start <= sent.start or doc[start - 1].text != "," or tok.tag_ not in ("NNS", "NN"):
        return False
    if _a_role(tok, PEOPLE):
        return False  # "A campfire in the woods, friends telling stories": people doing things are subjects
    if any(c.dep_ in ("det", "poss", "nummod") for c in tok.children):
        return False
    acting = any(c.dep_ == "acl" and c.tag_ == "VBG" for c in tok.children) or (
        tok.dep_ == "nsubj" and tok.head.tag_ == "VBG" and tok.head.i > tok.i)
    return acting and any(sent.start <= h < start - 1 and doc[h].dep_ != "pobj" and doc[h].lower_ not in _PLACE_PARTS
                          for h in things)


def _a_feature_of(tok: "Token", places: set[int]) -> bool:
    """Whether a noun is what a place is seen with ("a ramen shop with red lanterns", "a beach with palm trees")."""
    return tok.dep_ == "pobj" and tok.head.lower_ == "with" and tok.head.head.i in places


def _named_person(tok: "Token") -> bool:
    """A person named by a name without an article ("Olav"; "the Eiffel Tower" is no person) or by a role, one word
    or two ("knight", "the Queen", "police officer"); a generic person ("people") is a crowd in the background as
    often as a subject."""
    return _a_name(tok) or _a_role(tok, PERSON_ROLES)


def _ridden_by_a_person(verb: "Token") -> bool:
    """Whether a ride verb's rider, its subject or the noun it describes, is a person: a name without an article or
    a person word (`PEOPLE`, a role of one word or two)."""
    riders = [c for c in verb.children if c.dep_ in ("nsubj", "compound")]
    if verb.dep_ in ("acl", "relcl"):
        riders.append(verb.head)
    return any(_a_name(r) or _a_role(r, PEOPLE) for r in riders)


def _a_name(tok: "Token") -> bool:
    """A proper noun without an article ("Olav"; "the Eiffel Tower", "The Polar Express" are things)."""
    return tok.pos_ == "PROPN" and not any(c.dep_ == "det" for c in tok.children)


def _a_role(tok: "Token", words: frozenset[str]) -> bool:
    """Whether a noun, alone or with the nouns compounded onto it ("police officer"), is one of `words`."""
    lemma = tok.lemma_.lower()
    compound = " ".join([c.lower_ for c in tok.children if c.dep_ == "compound"] + [lemma])
    return lemma in words or compound in words or names_one_of(tok.lower_, words)


def _clause_between(doc: "Doc", head: int, tok: int) -> bool:
    """Whether a verb stands between a focus noun and a later conjunct or apposition: "A surfer paddling out at
    a stormy beach, grey sky and white spray" describes the scene after the subject's clause, not more subjects."""
    return any(doc[k].pos_ == "VERB" for k in range(min(head, tok) + 1, max(head, tok)))


def activity(doc: "Doc", head_index: int, lemma: Callable[["Token"], str] = lambda t: t.lemma_.lower(),
             nominal: Container[int] = ()) -> str:
    """What a person token is doing, as "verb [preposition] [object]" ("playing guitar", "running on
    treadmill"), or '' when nothing says; `lemma` normalises the object noun as entity heads are. A verb the
    repairs read as a noun (`nominal`: "girl walking in the rain neon lights reflections") is none."""
    tok = doc[head_index]
    verb: "Token | None" = None
    if tok.dep_ in _SUBJECT_DEPS and tok.head.pos_ in ("VERB", "AUX") and tok.head.i not in nominal:
        verb = tok.head
    else:
        # A clause on the person: a participle ("a girl singing") or a relative clause; sm also hangs a list's
        # plural on it as a finite acl ("the girl on the bicycle ..., sparks and splashes").
        verb = next((c for c in tok.children if c.pos_ == "VERB" and (
            c.dep_ == "relcl" or (c.dep_ == "acl" and c.tag_ in ("VBG", "VBN")))), None)
    if verb is None:
        return ""
    words = [verb.text.lower() if verb.tag_ == "VBG" else verb.lemma_.lower()]
    obj = next((c for c in verb.children if c.dep_ in _ACTIVITY_OBJECT_DEPS and c.pos_ in ("NOUN", "PROPN")),
               None)
    if obj is None:
        prep = next((c for c in verb.children if c.dep_ == "prep"), None)
        obj = next((c for c in prep.children if c.dep_ == "pobj"), None) if prep is not None else None
        if obj is not None and prep is not None and obj.pos_ in ("NOUN", "PROPN"):
            words.append(prep.lower_)
        else:
            obj = None
    if obj is not None:
        words.append(lemma(obj))
    return " ".join(w for w in words if w.isalpha() or "-" in w)


def roles_for(doc: "Doc", heads: Sequence[int], kinds: Sequence[str]) -> list[str]:
    """The role of each entity, given its head token index and kind, in order of mention."""
    focus = focus_tokens(doc)
    # "..., a lone vintage muscle car speeding toward the camera" (sm: car compound of "speeding" NN): the parse
    # makes the participle the noun, the entity's head is the word before it.
    heads_set = set(heads)
    focus |= {f - 1 for f in focus if f not in heads_set and f - 1 in heads_set and doc[f].lower_.endswith("ing")
              and doc[f - 1].dep_ == "compound" and doc[f - 1].head.i == f}
    things = [h for h, k in zip(heads, kinds) if k == "object"]
    focus = {f for f in focus if not _absolute_detail(doc, f, things)}
    sent = next(iter(doc.sents), None) if doc.has_annotation("DEP") else None
    root_is_entity = sent is not None and sent.root.i in heads
    roles = []
    for head, kind in zip(heads, kinds):
        tok = doc[head]
        in_focus = head in focus and not (tok.dep_ == "pobj" and tok.head.lower_ == "of" and root_is_entity
                                          and tok.head.head.lower_ not in _POSITION_WORDS)
        if kind == "scene":
            roles.append(SCENE)
        elif in_focus and kind == "object":
            roles.append(MAIN)
        else:
            roles.append(SECONDARY)
    if kinds and kinds[0] == "object":
        roles[0] = MAIN  # prompts name their subject first ("A fisherman hauling nets onto a boat ...")
    elif MAIN not in roles and not any(h in focus for h in heads):
        # "revealing a tiny ramen shop with red lanterns": what a place is seen "with" is a feature of the place, and
        # "..., steam escaping from the door" a detail: neither is the subject of a prompt about places
        places = {h for h, k in zip(heads, kinds) if k == "scene"}
        first = next((i for i, k in enumerate(kinds) if k == "object" and not _a_feature_of(doc[heads[i]], places)
                      and not _absolute_detail(doc, heads[i], things)), None)
        if first is not None:
            roles[first] = MAIN
    where = {h: k for k, h in enumerate(heads)}  # entity index by head token
    _move_ends(doc, where, kinds, roles)
    _owners(doc, where, kinds, roles)
    return roles


def _owners(doc: "Doc", where: dict[int, int], kinds: Sequence[str], roles: list[str]) -> None:
    """A main part with an owner ("the eyes of a black cat", "the tiger's eye") hands its role to the owner; one owned
    by a pronoun ("his short legs") leaves it to the subject named before."""
    heads = {k: h for h, k in where.items()}
    for head, k in where.items():
        tok = doc[head]
        if roles[k] != MAIN or tok.lemma_.lower() not in PART_NOUNS:
            continue
        owner = next((c.i for c in tok.children if c.dep_ == "poss"), None)
        if owner is not None and doc[owner].tag_ == "PRP$":
            # "his short legs sinking into the snow": the owner is a main subject named before, no part itself
            # ("close-up of her face, a single tear rolling down" keeps the face), a person or a name for "his" and
            # "her" ("Soft morning light, her eyes slowly open" keeps the eyes)
            personal = doc[owner].lower_ in ("his", "her")
            if any(roles[j] == MAIN and doc[heads[j]].lemma_.lower() not in PART_NOUNS
                   and (not personal or _could_be_his_or_hers(doc, heads[j])) for j in range(k)):
                roles[k] = SECONDARY
            continue
        if owner is None:
            prep = next((c for c in tok.children if c.dep_ == "prep" and c.lower_ == "of"), None)
            owner = next((c.i for c in prep.children if c.dep_ == "pobj"), None) if prep is not None else None
            if owner is not None and prep is not None and any(t.pos_ in ("VERB", "AUX")
                                                              for t in doc[prep.i + 1:owner]):
                owner = None  # "the engine of a train puffing smoke": the parser's object is past a verb
        j = where.get(owner) if owner is not None else None
        if j is not None and kinds[j] == "object":
            roles[j], roles[k] = MAIN, SECONDARY
        elif j is not None and kinds[j] == "scene":
            roles[k] = SECONDARY  # "the face of a massive waterfall": a place's side, not a body's


def _could_be_his_or_hers(doc: "Doc", head: int) -> bool:
    """Whether a main subject can be the "his" or "her" of a later part: a person, a name ("Waffles the corgi"), or
    the subject of a verb ("The knight raises his sword"), not a light or a stuff a prompt opens on."""
    tok = doc[head]
    if _a_role(tok, PEOPLE) or tok.dep_ in _SUBJECT_DEPS:
        return True
    i = head
    while i >= 0 and doc[i].pos_ in ("PROPN", "NOUN", "ADJ", "DET"):  # the phrase it ends ("Waffles the corgi")
        if _a_name(doc[i]):
            return True
        i -= 1
    return False


_MOVE_TARGETS = frozenset({"to", "toward", "towards", "into", "onto"})


def _move_ends(doc: "Doc", where: dict[int, int], kinds: Sequence[str], roles: list[str]) -> None:
    """A camera move "from A to B" whose start is the main subject (or its part) has its end in it too."""
    if not doc.has_annotation("DEP"):
        return
    for tok in doc:
        if tok.lower_ != "from":
            continue
        start = next((c.i for c in tok.children if c.dep_ == "pobj"), None)
        if start is None or start not in where or roles[where[start]] != MAIN:
            continue
        end = next((t for t in doc[start + 1:tok.sent.end] if t.lower_ in _MOVE_TARGETS and t.dep_ == "prep"),
                   None)
        # The same move: no clause between its ends ("from a vase as a cat jumps onto the table": a verb with its
        # own subject; a verb without one is often a noun the tagger missed, "from the ramen bowl to ...").
        if end is None or any(t.pos_ in ("VERB", "AUX") and any(c.dep_ in _SUBJECT_DEPS for c in t.children)
                              for t in doc[start + 1:end.i]):
            continue
        target = next((c.i for c in end.children if c.dep_ == "pobj"), None)
        if target is not None and target in where and kinds[where[target]] == "object":
            roles[where[target]] = MAIN
        break


__all__ = ["MAIN", "SCENE", "SECONDARY", "ROLES", "BORROWABLE", "GENERIC_PEOPLE", "PEOPLE", "focus_tokens", "activity",
           "roles_for"]
