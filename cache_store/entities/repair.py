"""Repairs of tagger mistakes before entities are read: words taken for nouns or verbs against the tags.

- **Nouns** the taggers mislabel (see `entities.extract`'s docstring, step 2): a word with a determiner attached
  ("a stop sign" with `sign` tagged VB), a non-stop-word ADJ/ADV in a nominal dependency ("on treadmill" tagged JJ)
  unless it is an adjective ("from big to small": an adjective is never an entity alone), an ADV right after a
  determiner-led run, the only word of a one-word prompt.
- **Verbs** the taggers take for nouns: the word after a camera word ("The camera orbits around", "camera pans
  left", "camera zoom in"), and a verb's -s form after a singular noun that opens the sentence with a singular
  determiner, when the sentence has no finite verb that word does not govern ("A lion changes from big to small",
  "a batter swings at a pitch", "A red fox trots through the snow, its fur standing out", tagged NNS). Such a
  word ends a candidate span and is never a head. With a determiner that only a singular noun takes ("a", "each",
  "this"; not "the"), or a possessor ("Luna's broom sputters and ..."), the sentence may have other finite verbs
  ("A bald eagle soars high above a canyon ... as it rides the currents"); the noun before it may be tagged as an
  adjective when the tables know it as a noun ("The cherry red convertible kicks up dust").
- **Verbs after a name** that opens its clause ("Kenji kneels", "as Reyes hurries back", "Olav hauls cod onto his
  boat"; `_named_subject_acts`): the -s word is no noun's plural, or a particle follows, or the clause speaks of a
  person; "Christmas lights in the window" stays a plural. A camera move named after a thing that opens its clause
  ("truck left, ...", "Pedestal up from the floor"; `_camera_move`) is a verb too, and a verb's -s form before a
  determiner is one after a plural noun as well ("a trench coat and fedora lights a cigarette").
- **Nouns that open a sentence** the tagger read as a verb, adjective or adverb, as casual prompts write them
  without a determiner ("puppy sleeping on the couch", "kitten in a box", "surfer riding a huge wave"): the word is
  a noun in the tables, or in none of them ("astronot walking on mars"), and a participle, a preposition or a noun
  follows. A word prompts use as a command ("fly over the city", "show a cat") stays a verb.
- **A plural noun** the tagger read as a verb's -s form when no verb has that form ("horse chestnuts falling";
  `_plurals_taken_for_verbs`). **A verb after a plural**: a verb's base form tagged as a noun after a plural that
  opens its clause with a word before it, before an adverb or a path preposition, is a verb ("Northern lights
  ripple over the harbor"; not "Sports bar across the street" or "Arms deal behind closed doors";
  `_verbs_after_plurals`), and the sentence's verb for the -s rule above.
- **Looks after their thing**: a lower-case word the tables know only as an adjective, tagged as a noun right after
  a noun, is never a head ("little robot lost in junkyard sad"; `_trailing_looks`). **A noun taken for a
  preposition**: a word of four letters or more tagged IN, right after a noun or an adjective, that the tables know
  only as a noun is one ("a rainbow trout swimming upstream"; `_nouns_taken_for_prepositions`). **A decade's noun**: a known
  noun tagged JJ right after a decade, before a preposition or a verb, is the noun ("The red fifties convertible at
  a gas station"; `_nouns_after_decades`). **A verb before its object**: an -s word the tables know only as a verb,
  after a noun, before "him", "them" or a determiner, is a verb ("a red dragon's fire engulfs him").
- **A noun before its participle** read as an adjective before a noun ("a goldfish swimming in a glass bowl", sm:
  JJ NN) or before a participle tagged right ("A fisherman standing", JJ VBG): the first word is the noun, the -ing
  word a verb (`_nouns_before_participles`). A hyphenated adjective ("knee-deep") is no noun, whatever its
  determiner.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .lexicon import SCENE_HEADS, a_decade
from .wordclass import FUNCTION_WORDS, WordClasses

if TYPE_CHECKING:
    from spacy.tokens import Doc, Span, Token

_HEAD_POS = frozenset({"NOUN", "PROPN"})
_NOMINAL_DEPS = frozenset({"nsubj", "nsubjpass", "dobj", "pobj", "appos"})
CAMERA_WORDS = frozenset({"camera", "cameras", "cam", "lens", "viewpoint", "pov", "shot"})
# Determiners that need a singular noun: "a lion changes" cannot be a plural compound.
_SINGULAR_DETS = frozenset({"a", "an", "the", "each", "every", "one", "this", "that"})
_ONLY_SINGULAR_DETS = _SINGULAR_DETS - {"the"}
_POSSESSOR_TAGS = frozenset({"POS", "PRP$"})
_OBJECT_DETS = frozenset({"a", "an", "his", "her", "its", "their"})
_OBJECT_WORDS = _OBJECT_DETS | {"him", "them"}
# Verbs a prompt gives as a command to the camera or the viewer: a sentence opening with one is an imperative.
IMPERATIVE_VERBS = frozenset({
    "fly", "move", "go", "rise", "run", "travel", "glide", "soar", "swoop", "drift", "float", "push", "pull",
    "follow", "circle", "sweep", "descend", "climb", "spin", "rotate", "turn", "look", "show", "reveal", "start",
    "begin", "cut", "fade", "focus", "track", "orbit", "watch", "see", "make", "create", "generate", "imagine",
    "render", "draw", "paint", "film", "shoot", "capture", "frame", "zoom", "pan", "tilt", "dolly", "crane", "truck",
    "pedestal", "walk", "enter", "exit", "approach", "fall", "drop", "lift", "open", "close", "head", "cruise",
    "dance", "swim", "jump", "sit", "stand", "play", "sing", "ride", "drive", "race", "explore", "hide", "escape",
    "wander", "roam", "dive", "surf", "skate", "ski", "hike", "sail", "row", "paddle", "fight", "chase", "hunt",
})
# Nouns the tagger reads as prepositions in their other uses ("save for", "pace", "two times"), and "zen", a mood it
# reads as one ("koi pond petals zen"); true prepositions are `wordclass.FUNCTION_WORDS` ("despite the rain", "till
# dawn"), and words of under four letters ("w", "cos", "al", "de") are never repaired.
_PREPOSITION_NOUNS = FUNCTION_WORDS | {"save", "pace", "post", "times", "bout", "upside", "feat", "zen"}
_OPENING_TAGS = frozenset({"VB", "VBP", "VBZ", "VBN", "VBD", "JJ", "RB", "NNP"})
_VERB_POS = frozenset({"VERB", "AUX"})
_FINITE_TAGS = frozenset({"VBZ", "VBP", "VBD", "MD"})


@dataclass
class Repairs:
    """Token indices read as nouns (`in` tests them) and those read as verbs against the tagger."""

    nominal: set[int] = field(default_factory=set)
    verbal: set[int] = field(default_factory=set)
    looks: set[int] = field(default_factory=set)  # adjectives tagged as nouns after a noun: never a head

    def __contains__(self, index: object) -> bool:
        return index in self.nominal


def repairs(doc: "Doc", words: WordClasses) -> Repairs:
    """The repaired nouns and verbs of a parsed prompt."""
    after = _verbs_after_plurals(doc, words)
    verbal = _verbs_taken_for_nouns(doc, words, frozenset(after))
    verbal |= {v for v in after if v - 1 not in verbal}  # "Olav hauls cod onto his boat": "cod" is no verb
    # The subject of a repaired verb is a noun even where the tagger said adjective ("convertible kicks").
    subjects = {v - 1 for v in verbal if doc[v - 1].tag_ == "JJ" and (doc[v - 1].lower_ in words.nouns
                                                                      or doc[v - 1].text[:1].isupper())}
    doers, doing = _nouns_before_participles(doc, words)
    verbal |= doing
    return Repairs((_repaired_nouns(doc, words) | _opening_nouns(doc, words) | subjects | doers
                    | _plurals_taken_for_verbs(doc, words) | _nouns_after_decades(doc, words)
                    | _nouns_taken_for_prepositions(doc, words) | _places_after_mass_nouns(doc)) - verbal, verbal,
                   _trailing_looks(doc, words))


def _nouns_taken_for_prepositions(doc: "Doc", words: WordClasses) -> set[int]:
    """A word tagged as a preposition that the tables know only as a noun, right after a noun or an adjective ("a
    rainbow trout swimming upstream", sm: trout IN): prepositions are a closed class, and the few the noun table
    holds that are no stop words or adverbs are listed (`wordclass.FUNCTION_WORDS`, `_PREPOSITION_NOUNS`)."""
    return {tok.i for tok in doc[1:] if tok.tag_ == "IN" and tok.is_alpha and len(tok.text) >= 4 and not tok.is_stop
            and tok.lower_ in words.nouns and tok.lower_ not in _PREPOSITION_NOUNS
            and tok.lower_ not in words.adverbs and not words.is_adjective(tok.lower_)
            and doc[tok.i - 1].pos_ in ("NOUN", "PROPN", "ADJ")}


def _nouns_after_decades(doc: "Doc", words: WordClasses) -> set[int]:
    """A noun the tagger read as an adjective after a decade, before a preposition or a verb ("The red fifties
    convertible at an old gas station", sm: NNS JJ): a decade describes the thing after it."""
    out: set[int] = set()
    if not words:
        return out
    for tok in doc[1:]:
        nxt = doc[tok.i + 1] if tok.i + 1 < len(doc) else None
        # a preposition or a verb must go on ("1990s british, a punk girl", "1960s classic and elegant": looks)
        if tok.tag_ == "JJ" and tok.lower_ in words.nouns and a_decade(doc[tok.i - 1].lower_) \
                and nxt is not None and nxt.pos_ in ("ADP", "VERB", "AUX"):
            out.add(tok.i)
    return out


def _trailing_looks(doc: "Doc", words: WordClasses) -> set[int]:
    """A lower-case word the tables know only as an adjective, tagged as a noun right after a noun ("little robot
    lost in junkyard sad", "beach peaceful"): a look said after its thing, as casual prompts do, never the head."""
    out: set[int] = set()
    if not words:
        return out
    for tok in doc[1:]:
        word = tok.lower_
        if tok.tag_ not in ("NN", "NNP", "NNPS") or not tok.is_alpha or not tok.is_lower:
            continue
        if words.is_adjective(word) and word not in words.nouns and word not in words.protected \
                and doc[tok.i - 1].pos_ in _HEAD_POS:
            out.add(tok.i)
    return out


def _plurals_taken_for_verbs(doc: "Doc", words: WordClasses) -> set[int]:
    """An -s word the tagger read as a verb (VBZ) that is no verb's form but a noun's plural ("horse chestnuts
    falling from a tree": no verb "chestnut")."""
    out: set[int] = set()
    if not words:
        return out
    for tok in doc:
        word = tok.lower_
        if tok.tag_ != "VBZ" or not tok.is_alpha or not word.endswith("s") or words.is_verb_form(word):
            continue
        if word in words.irregular or word in words.protected:
            continue
        if _a_nouns_plural(word, words):
            out.add(tok.i)
    return out


def _nouns_before_participles(doc: "Doc", words: WordClasses) -> tuple[set[int], set[int]]:
    """A noun after a determiner that the tagger read as an adjective before an -ing word it read as a noun ("a
    goldfish swimming in a bowl", "a starfish lying on the sand": sm tags JJ NN): the word is the noun, the -ing
    word its participle. The word must be a noun the tables do not know as an adjective, and the -ing word a verb's
    with no noun after it ("a goldfish swimming pool" stays a pool)."""
    nouns: set[int] = set()
    verbs: set[int] = set()
    if not words:
        return nouns, verbs
    for tok in doc[1:len(doc) - 1]:
        if tok.tag_ != "JJ" or not tok.is_alpha or doc[tok.i - 1].pos_ != "DET":
            continue
        word, nxt = tok.lower_, doc[tok.i + 1]
        if word not in words.nouns or words.is_adjective(word):
            continue
        ing = nxt.lower_
        stems = (ing[:-3], ing[:-3] + "e", ing[:-4], ing[:-4] + "ie")  # swim-ming, glid-ing, ly-ing
        if nxt.tag_ == "VBG" and ing.endswith("ing"):
            nouns.add(tok.i)  # "A fisherman standing knee-deep" (sm: JJ VBG): the participle is tagged right
            continue
        if nxt.tag_ != "NN" or not ing.endswith("ing") or not any(stem in words.verbs for stem in stems):
            continue
        after = doc[tok.i + 2] if tok.i + 2 < len(doc) else None
        if after is not None and after.pos_ in _HEAD_POS:
            continue
        nouns.add(tok.i)
        verbs.add(nxt.i)
    return nouns, verbs


def _opening_nouns(doc: "Doc", words: WordClasses) -> set[int]:
    """A sentence's first word read as a verb, adjective or adverb although a noun opens it (see module docstring)."""
    out: set[int] = set()
    if not words:
        return out
    for tok in doc:
        if not tok.is_sent_start or not tok.is_alpha or tok.is_stop or tok.tag_ not in _OPENING_TAGS:
            continue
        if tok.i + 1 >= len(doc):
            continue
        word, nxt = tok.lower_, doc[tok.i + 1]
        if tok.tag_ == "NNP" and not tok.is_lower:
            continue  # a capitalised name ("Kenji walks"): the tagger is right
        if word in IMPERATIVE_VERBS or any(b in IMPERATIVE_VERBS for b in _bases(word)):
            continue
        noun = word in words.nouns or any(b in words.nouns for b in _bases(word)[1:3])
        if not noun and (words.known(word) or len(word) < 4):
            continue
        if tok.tag_ in ("JJ", "RB") and (words.is_adjective(word) or word in words.adverbs):
            continue  # "red car driving", "slowly ...": a modifier, not a mistagged noun
        if nxt.tag_ == "VBG" or nxt.pos_ == "ADP" or (nxt.pos_ == "NOUN" and nxt.dep_ in ("compound", "dobj")):
            out.add(tok.i)
        elif nxt.tag_ == "VBZ" and tok.text[:1].isupper() and not words.known(word):
            out.add(tok.i)  # "Ilse hauls a dripping net" (sm: Ilse RB): a name no table knows, acting
    return out


def _bases(word: str) -> list[str]:
    """The word, then its forms without a plural or third-person -s ("butterflys" -> "butterfly")."""
    out = [word]
    if word.endswith("ies") and len(word) > 4:
        out.append(word[:-3] + "y")
    if word.endswith("s") and len(word) > 3:
        out.append(word[:-1])
    return out


def _verbs_taken_for_nouns(doc: "Doc", words: WordClasses, verbs: frozenset[int] = frozenset()) -> set[int]:
    """Verbs the tagger took for nouns (the module docstring); `verbs` are verbs already repaired elsewhere, which
    give a sentence its verb ("Seagulls circle above the fishing boats": "boats" is the plural)."""
    out: set[int] = set()
    if not words:
        return out
    for tok in doc:
        if _camera_move(doc, tok):
            out.add(tok.i)  # "truck left, a herd of elephants ...", "Pedestal up from the floor": a camera move
            continue
        if tok.i == 0 or not tok.is_alpha or not words.is_verb_form(tok.lower_):
            continue
        prev = doc[tok.i - 1]
        if prev.lower_ in CAMERA_WORDS and tok.pos_ in ("NOUN", "PROPN", "VERB", "ADJ", "X"):
            out.add(tok.i)  # "camera orbits", "camera zoom in", "camera pans left"
            continue
        if _named_subject_acts(doc, tok, words):
            out.add(tok.i)  # "Olav hauls cod onto his boat", "Kenji kneels beside a river", "Reyes hurries back"
            continue
        noun_prev = not prev.is_stop and (prev.tag_ in ("NN", "NNP", "NNS")
                                          or (prev.tag_ == "JJ" and prev.lower_ in words.nouns))
        if not tok.lower_.endswith("s") or not noun_prev:
            continue
        # "a red dragon's fire engulfs him", "the wave engulfs them" (sm: NN, NNP): an -s word the tables know only
        # as a verb, which takes any determiner after it ("a dragon's breath engulfs the village")
        verb_only = (tok.tag_ == "NN" or (tok.tag_ == "NNP" and tok.is_lower)) and tok.lower_ not in words.nouns \
            and not _a_nouns_plural(tok.lower_, words)
        if tok.tag_ not in ("NNS", "VBZ") and not verb_only:
            continue
        nxt = doc[tok.i + 1] if tok.i + 1 < len(doc) else None
        if nxt is not None and (nxt.lower_ in _OBJECT_WORDS or (verb_only and nxt.pos_ == "DET")):
            # "... in a long coat lights a cigarette", "a trench coat and fedora lights a cigarette" (sm: fedora
            # NNS): a plural noun never takes a determiner or an object pronoun after it.
            out.add(tok.i)
            continue
        if prev.tag_ == "NNS":
            continue
        sent = tok.sent if doc.has_annotation("DEP") else doc[:]
        j = prev.i
        while j > sent.start and (doc[j - 1].pos_ in ("ADJ", "NOUN", "PROPN", "NUM")
                                  or doc[j - 1].tag_ in ("HYPH", "VBG", "VBN")
                                  or (doc[j - 1].tag_ == "CC" and j - 2 >= sent.start and doc[j - 2].tag_ == "HYPH")) \
                and doc[j - 1].tag_ != "NNS":
            j -= 1  # "a sleek high-speed train glides", "a cherry red 1959 convertible", "a white-and-orange sneaker"
        det = doc[j - 1] if j > sent.start else None
        if det is None or (nxt is not None and nxt.pos_ in _HEAD_POS):
            continue
        only_singular = det.lower_ in _ONLY_SINGULAR_DETS or det.tag_ in _POSSESSOR_TAGS
        if not only_singular and (det.lower_ not in _SINGULAR_DETS or _has_finite_verb(sent, tok, also=verbs)):
            continue  # "the dog toys lie on the floor": the sentence has its verb
        out.add(tok.i)
    return out


# Camera moves named after things, as a prompt opens a clause with them: "truck left", "pedestal up", "boom down".
_MOVE_NOUNS = frozenset({"truck", "pedestal", "boom", "crane", "dolly", "jib"})
_MOVE_WAYS = frozenset({"left", "right", "up", "down", "in", "out", "forward", "back", "backward", "backwards"})


def _camera_move(doc: "Doc", tok: "Token") -> bool:
    """A camera move named after a thing that opens its clause ("truck left, a herd ...", not "a truck left in")."""
    if tok.lower_ not in _MOVE_NOUNS or tok.i + 1 >= len(doc) or doc[tok.i + 1].lower_ not in _MOVE_WAYS:
        return False
    return tok.i == 0 or doc[tok.i - 1].is_punct


_CLAUSE_OPENERS = frozenset({"as", "while", "when", "then", "and", "before", "after", "until", "once"})
_PARTICLES = frozenset({"RB", "RP"})
_PERSON_PRONOUNS = frozenset({"his", "her", "he", "she", "him", "himself", "herself", "their", "them", "they"})


def _a_nouns_plural(word: str, words: WordClasses) -> bool:
    """Whether an -s word is the plural of a noun the tables know ("chestnuts", "boxes", "berries")."""
    bases = (word[:-1], word[:-2] if word.endswith("es") else "", word[:-3] + "y" if word.endswith("ies") else "")
    return any(b and b in words.nouns for b in bases)


def _named_subject_acts(doc: "Doc", tok: "Token", words: WordClasses) -> bool:
    """A verb's -s form right after a name that opens its clause ("Kenji kneels", "as Reyes hurries back"), which
    sm tags NNS and glues to the name. A plural after a name ("Christmas lights in the window", "London buses")
    stays a noun: the word must be no noun's plural, or be followed by a particle ("back", "down"), or the clause
    must go on to speak of a person ("his boat")."""
    prev = doc[tok.i - 1]
    if tok.tag_ not in ("NNS", "VBZ") or not tok.lower_.endswith("s") or not prev.is_alpha or prev.is_stop:
        return False
    # A name: capitalised, no acronym, and no common noun unless the tagger says name inside a sentence ("Dog walks"
    # opening a caption is a noun; "as Reyes hurries" is a name although the tables know a noun "reyes").
    common = prev.lower_ in words.nouns and (prev.is_sent_start or prev.tag_ != "NNP")
    if not prev.text[0].isupper() or prev.is_upper or common:
        return False
    before = doc[prev.i - 1] if prev.i > 0 else None
    if before is not None and not prev.is_sent_start and not before.is_punct and before.lower_ not in _CLAUSE_OPENERS:
        return False  # "the old Ford trucks": a name inside a noun phrase
    word = tok.lower_
    if not _a_nouns_plural(word, words):
        return True  # "kneels": no noun "kneel"
    nxt = doc[tok.i + 1] if tok.i + 1 < len(doc) else None
    if nxt is not None and nxt.tag_ in _PARTICLES:
        return True
    end = tok.sent.end if doc.has_annotation("DEP") else len(doc)
    return any(t.lower_ in _PERSON_PRONOUNS for t in doc[tok.i + 1:end])


# Places named by their users that `lexicon.SCENE_HEADS` leaves out ("Sports bar across the street").
_PLACE_WORDS = SCENE_HEADS | {"bar", "center", "centre", "court"}
_PATH_PREPOSITIONS = frozenset({"over", "through", "across", "above", "below", "behind", "along", "around", "past",
                                "into", "onto", "toward", "towards", "beneath", "underneath", "between", "among",
                                "amid", "from", "up", "down", "off"})


# Plurals that end in no -s: a verb's plural form may follow them ("people shop at the market").
_PLURALS_WITHOUT_S = frozenset({"people", "children", "men", "women", "police", "cattle", "fish", "sheep", "deer",
                                "mice", "geese", "feet", "teeth", "folk", "staff", "crew", "livestock"})


def _places_after_mass_nouns(doc: "Doc") -> set[int]:
    """A place noun tagged as a plural's verb (VBP) right after a noun the tagger took for a plural although it is
    none ("a cozy ramen shop on a rainy street", sm: ramen NNS, shop VBP): the noun names what the place is for,
    and the place is the head ("the ramen shop during a snowfall"). A plural without -s keeps its verb ("people shop
    at the market")."""
    out: set[int] = set()
    for tok in doc[1:]:
        prev, word = doc[tok.i - 1], tok.lower_
        if tok.tag_ != "VBP" or word not in _PLACE_WORDS:
            continue
        if prev.tag_ != "NNS" or not prev.is_alpha or prev.lower_.endswith("s") or prev.lower_ in _PLURALS_WITHOUT_S:
            continue
        out.add(tok.i)
    return out


def _verbs_after_plurals(doc: "Doc", words: WordClasses) -> set[int]:
    """A verb's base form tagged as a noun right after a plural noun that opens its clause, before an adverb or a
    preposition of a path, in a sentence with no other finite verb ("Northern lights ripple over the harbor",
    "spores drift through the air"): the plural is the subject, the word its verb. A plural after "a" or inside a
    prepositional phrase is a modifier ("a sports ball", "at the airport arrivals gate"), and so may a bare plural
    ("Weapons cache beneath the floorboards"): the plural needs a determiner or a word before it ("Wild mustangs
    gallop across", "The kids race across")."""
    out: set[int] = set()
    if not words:
        return out
    for tok in doc[1:]:
        prev, word = doc[tok.i - 1], tok.lower_
        if tok.tag_ not in ("NN", "NNP") or not tok.is_alpha or word.endswith("s") or word not in words.verbs:
            continue
        if word in _PLACE_WORDS:
            continue  # "Sports bar across the street", "Kids room above the garage": a place named by its users
        if prev.tag_ != "NNS" or not _a_nouns_plural(prev.lower_, words):
            continue
        nxt = doc[tok.i + 1] if tok.i + 1 < len(doc) else None
        # a way or a manner after it, as a verb takes ("ripple over", "drift slowly"); "at", "in", "on" and "of"
        # follow nouns as often ("the sports bar at night", "the kids room in the morning")
        if nxt is None or not (nxt.tag_ in ("RB", "RP") or nxt.lower_ in _PATH_PREPOSITIONS):
            continue
        sent = tok.sent if doc.has_annotation("DEP") else doc[:]
        k = prev.i
        while k > sent.start and (doc[k - 1].pos_ in ("ADJ", "NOUN", "PROPN", "NUM") or doc[k - 1].tag_ == "HYPH"):
            k -= 1
        before = doc[k - 1] if k > sent.start else None
        if before is not None and before.pos_ == "DET":
            if before.lower_ in _ONLY_SINGULAR_DETS:
                continue
            before = doc[before.i - 1] if before.i > sent.start else None
        if before is not None and before.tag_ == "IN" or _has_finite_verb(sent, tok):
            continue
        if k == prev.i and (before is None or before.pos_ != "DET"):
            continue  # a bare plural may name what the next noun is for ("Arms deal behind closed doors")
        out.add(tok.i)
    return out


def _has_finite_verb(sent: "Span", tok: "Token", also: frozenset[int] = frozenset()) -> bool:
    """Whether the sentence has a verb other than `tok` that can be its main verb: a finite one (VBZ, VBP, VBD,
    MD), or one of `also` (verbs repaired from nouns), that `tok` does not govern. A participle does not count ("A
    red fox trots through the snow, its fur standing out"), nor a verb `tok` governs ("A surfer paddles out and
    catches a wave")."""
    for t in sent:
        if t.i == tok.i or (t.i not in also and (t.pos_ not in _VERB_POS or t.tag_ not in _FINITE_TAGS)):
            continue
        if not tok.is_ancestor(t):
            return True
    return False


def _repaired_nouns(doc: "Doc", words: WordClasses) -> set[int]:
    """Indices of tokens treated as nouns although the tagger said ADJ/ADV (see module docstring)."""
    repaired: set[int] = set()
    content = [t for t in doc if t.is_alpha and not t.is_stop]
    if len(content) == 1 and _looks_mistagged(content[0]) and not (content[0].pos_ == "ADJ" and words.is_adjective(
            content[0].lower_) and content[0].lower_ not in words.nouns):
        # A one-word prompt ("campsite" tagged VB, "carrousel" RB, "a remote" JJ) names a thing.
        repaired.add(content[0].i)
    for tok in doc:
        if tok.pos_ in ("VERB", "ADJ", "ADV", "X") and tok.is_alpha and any(
                c.dep_ == "det" and c.i < tok.i for c in tok.children):
            prev = doc[tok.i - 1] if tok.i > 0 else None
            if (tok.tag_ == "VBG" and prev is not None and prev.is_alpha and prev.dep_ != "det"
                    and prev.pos_ in ("ADJ", "ADV", "NOUN", "PROPN")):
                # "a golden retriever playing" (sm: det -> playing): the noun is the word before the participle
                repaired.add(prev.i)
                continue
            if tok.i > 1 and is_glue_hyphen(doc, tok.i - 1) and words.is_adjective(tok.lower_):
                continue  # "A fisherman standing knee-deep": a hyphenated adjective, whatever its determiner
            repaired.add(tok.i)  # a determiner attached to it makes it a noun: "a stop sign" (sign as VB)
            continue
        if tok.pos_ not in ("ADJ", "ADV") or tok.is_stop or not tok.is_alpha:
            continue
        if tok.pos_ == "ADV" and tok.lower_.endswith("ly"):
            continue
        if tok.dep_ in _NOMINAL_DEPS and not (tok.pos_ == "ADJ" and words.is_adjective(tok.lower_)):
            # ... but "small" in "from big to small" (pobj, JJ) stays an adjective: never an entity alone
            nxt = doc[tok.i + 1] if tok.i + 1 < len(doc) else None
            # "on treadmill" (pobj, tagged ADJ) is a noun; an ADJ before a noun, or before a comma and
            # another adjective ("in a warm, welcoming light"), is a modifier.
            after = doc[tok.i + 2] if tok.i + 2 < len(doc) else None
            coordinated = nxt is not None and nxt.text == "," and after is not None and after.pos_ == "ADJ"
            if nxt is None or (nxt.pos_ not in _HEAD_POS and not coordinated):
                repaired.add(tok.i)
                continue
        if tok.pos_ == "ADV" and tok.i > 0:
            # "A golden retriever running": ADV right after a determiner-led run of modifiers.
            j = tok.i - 1
            while j >= 0 and doc[j].pos_ in ("ADJ", "NOUN", "PROPN"):
                j -= 1
            nxt = doc[tok.i + 1] if tok.i + 1 < len(doc) else None
            if j >= 0 and j < tok.i - 1 and doc[j].pos_ == "DET" and (nxt is None or nxt.pos_ not in
                                                                      ("ADJ", "ADV", "NOUN", "PROPN")):
                repaired.add(tok.i)
    return repaired


HYPHENS = frozenset({"-", "\u2010", "\u2011", "\u2013"})


def is_glue_hyphen(doc: "Doc", i: int) -> bool:
    """A hyphen written tight between two words ("close-up", "sci-fi", "knee-deep")."""
    tok = doc[i]
    return (tok.text in HYPHENS and 0 < i < len(doc) - 1 and not doc[i - 1].whitespace_
            and not tok.whitespace_ and has_alnum(doc[i - 1].text) and has_alnum(doc[i + 1].text))


def has_alnum(text: str) -> bool:
    """Whether a text holds a letter or a digit."""
    return any(ch.isalnum() for ch in text)


def _looks_mistagged(tok: "Token") -> bool:
    """A lone word the tagger did not call a noun: kept unless it is an inflected verb or an -ly adverb."""
    if tok.pos_ in ("X", "INTJ", "ADJ"):
        return True  # "arch" (JJ), "glacier" (JJR), "a remote" (JJ)
    if tok.pos_ == "VERB":
        return tok.tag_ in ("VB", "VBP")
    return tok.pos_ == "ADV" and tok.tag_ == "RB" and not tok.lower_.endswith("ly")


__all__ = ["CAMERA_WORDS", "HYPHENS", "Repairs", "has_alnum", "is_glue_hyphen", "repairs"]
