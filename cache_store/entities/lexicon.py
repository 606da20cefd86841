"""The word lists entity extraction reads: quantities, -ing nouns, plural-only nouns, places, conditions, colours.

Each list is a closed class or a lexicon the parser cannot know (see `entities` for how each is used).
"""
from __future__ import annotations

import re
from functools import lru_cache

QUANTITY_WORDS = frozenset({
    "few", "several", "many", "numerous", "multiple", "various", "some", "each", "every", "both", "all",
    "another", "other", "much", "more", "most", "any", "no", "single", "dozen", "dozens", "hundreds",
    "thousands", "millions", "countless", "lots",
})
# Nouns that only count or collect what follows "of": "a group of people" keeps "people", not "group".
QUANTITY_HEADS = frozenset({
    "group", "bunch", "pair", "couple", "lot", "number", "handful", "dozen", "set", "series", "variety",
    "array", "collection", "cluster", "crowd", "herd", "flock", "swarm", "pack", "school", "team", "row",
    "pile", "stack", "heap", "kind", "type", "sort", "amount", "quantity", "plenty", "majority", "bundle", "troop", "colony", "fleet", "range", "assortment", "multitude", "host",
    # containers and portions: "a bowl of ramen" is about the ramen ("a bowl of chips" / "a bowl of ramen" differ)
    "bowl", "cup", "mug", "glass", "plate", "jar", "bottle", "basket", "bucket", "tray", "slice", "piece", "box",
    "bag", "carton", "sack", "spoonful", "plateful", "scoop",
})
LOCATIVE_PREPOSITIONS = frozenset({
    "in", "on", "at", "along", "through", "across", "over", "under", "near", "by", "inside", "into",
    "onto", "within", "around", "beneath", "below", "above", "beside", "amid", "amidst", "among", "atop",
    "throughout", "underneath", "toward", "towards", "outside",
})
# Prepositions after which a proper name is a place: "in Paris", "across Tokyo" (not "by Hokusai").
PLACE_NAME_PREPOSITIONS = frozenset({"in", "at", "across", "through", "around", "near", "over", "inside",
                                     "outside", "within", "throughout"})
# Nouns ending in -ing that stay nouns after another noun ("oil painting", "office building").
ING_NOUNS = frozenset({
    "painting", "building", "ceiling", "clothing", "wedding", "evening", "morning", "railing", "lightning",
    "drawing", "carving", "dumpling", "pudding", "frosting", "icing", "awning", "bedding", "stuffing",
    "sibling", "ending", "opening", "setting", "clearing", "coating", "lining", "topping", "seasoning",
    "dressing", "filling", "stocking", "herring", "duckling", "gosling", "seedling", "sapling", "earring",
    "darling", "flooring", "tiling", "housing", "lodging", "dwelling", "gathering", "dining", "seating",
    "bowling", "offspring", "siding", "paneling", "panelling", "shielding",
})
# Places whose name ends like a plural; written in lower case (casual and tag prompts) the tagger calls them plural
# nouns and the lemmatiser cuts them ("hiking in the alps" -> "alp", "astronaut on mars" -> "mar").
MOUNTAIN_RANGES = ("alps", "andes", "himalayas", "rockies", "pyrenees", "dolomites", "appalachians")
PLURAL_PLACES = MOUNTAIN_RANGES + ("maldives", "bahamas", "philippines", "seychelles", "hebrides", "galapagos",
                                   "azores", "netherlands", "everglades", "mars", "athens")
# Plural-only nouns the rule lemmatizer would cut ("clothes" -> "clothe").
LEMMA_EXCEPTIONS = {
    "clothes": "clothes", "pants": "pants", "trousers": "trousers", "jeans": "jeans", "shorts": "shorts",
    "glasses": "glasses", "sunglasses": "sunglasses", "goggles": "goggles", "scissors": "scissors",
    "binoculars": "binoculars", "species": "species", "series": "series", "news": "news",
    "headphones": "headphones", "pajamas": "pajamas", "pyjamas": "pyjamas", "tongs": "tongs",
    # -men words that are no plural of "man" ("ramen" is not "raman")
    "ramen": "ramen", "abdomen": "abdomen", "omen": "omen", "specimen": "specimen", "regimen": "regimen",
    "stamen": "stamen",
    # places named in the plural ("the woods" is no piece of wood, "the alps" no alp, "mars" no mar)
    "woods": "woods", "badlands": "badlands", **{name: name for name in PLURAL_PLACES},
}
# Places and settings (the VBench `scene` dimension's categories plus common landscape and room words).
SCENE_HEADS = frozenset({
    "alley", "alleyway", "aquarium", "arch", "arena", "airport", "attic", "avenue", "backyard", "bakery",
    "balcony", "ballroom", "barn", "basement", "bathroom", "bay", "beach", "bedroom", "boulevard",
    "bridge", "cafe", "café", "cafeteria", "campsite", "campus", "canal", "canyon", "carousel", "carrousel",
    "castle", "cathedral", "cave", "cavern", "cellar", "cemetery", "church", "city", "cityscape",
    "classroom", "cliff", "coast", "coastline", "corridor", "countryside", "courtyard", "creek", "crosswalk",
    "desert", "dock", "downtown", "driveway", "dune", "factory", "farm", "farmland", "field", "forest",
    "fountain", "galaxy", "garage", "garden", "glacier", "greenhouse", "grove", "gym", "gymnasium", "hall",
    "hallway", "harbor", "harbour", "highway", "hill", "hillside", "horizon", "hospital", "hotel", "house",
    "iceberg", "island", "jungle", "junkyard", "kitchen", "laboratory", "lagoon", "lake", "lakeside",
    "landscape", "lane", "lawn", "library", "lighthouse", "lobby", "mall", "mansion", "marina", "market",
    "marketplace", "marsh", "meadow", "monastery", "mosque", "mountain", "mountainside", "museum",
    "neighborhood", "neighbourhood", "nursery", "ocean", "office", "orchard", "palace", "park", "pasture",
    "patio", "pavement", "pharmacy", "pier", "plain", "plateau", "platform", "playground", "plaza", "pond",
    "pool", "porch", "prairie", "raceway", "railway", "rainforest", "ranch", "reef", "restaurant", "river",
    "riverbank", "road", "room", "rooftop", "runway", "savanna", "savannah", "school", "sea", "seashore",
    "seaside", "shop", "shore", "shoreline", "shower", "sidewalk", "skyline", "sky", "skyscraper", "slope",
    "space", "square", "stadium", "stage", "staircase", "station", "store", "stream", "street", "studio",
    "suburb", "subway", "supermarket", "swamp", "temple", "terrace", "theater", "theatre", "town", "track",
    "trail", "tundra", "tunnel", "university", "valley", "village", "vineyard", "volcano", "warehouse",
    "waterfall", "waterfront", "wetland", "wilderness", "windmill", "woodland", "woods", "workshop", "yard",
    "zoo",
    # Venues, buildings seen as places and landforms the VBench categories leave out (issue 25's prose and series).
    "nightclub", "discotheque", "pub", "tavern", "saloon", "diner", "bistro", "brewery", "winery", "casino",
    "arcade", "salon", "barbershop", "bookstore", "bookshop", "boutique", "gallery", "venue", "lounge", "dojo",
    "shrine", "pagoda", "bazaar", "souk", "courthouse", "prison", "jail", "chapel", "inn", "motel", "hostel",
    "resort", "spa", "skatepark", "auditorium", "amphitheater", "amphitheatre", "colosseum", "racetrack",
    "velodrome", "rink", "fairground", "boardwalk", "promenade", "port", "seaport", "fjord", "gorge", "ravine",
    "oasis", "steppe", "badlands", "mesa", "ridge", "summit", "crater", "cove", "inlet", "atoll", "estuary",
    "glade", "thicket", "moor", "heath", "bog", "quarry", "underpass", "overpass", "laundromat", "observatory",
    "planetarium", "cockpit", "hangar", "bunker", "metropolis", "slum", "favela", "hamlet", "outback", "taiga",
    "paddy", "riverside", "backstreet", "storefront", "penthouse", "loft", "apartment", "cabin", "cottage",
    "chalet", "farmhouse", "villa", "manor", "fortress", "citadel", "ruin", "lakeshore", "waterway", "dungeon",
    "catacomb", "sanctuary", "plantation",
    *PLURAL_PLACES,
})
# Multi-word places whose head alone would say "object" (a jail cell, a phone booth, a golf course).
SCENE_PHRASES = frozenset({
    "jail cell", "phone booth", "golf course", "food court", "construction site", "industrial area",
    "parking lot", "ocean floor", "sea floor", "forest floor", "outer space", "train railway", "hot spring",
})
# Settings only as the object of a locative preposition ("in the water", "on the grass", "in the snow").
LOCATIVE_SCENE_HEADS = frozenset({
    "water", "snow", "grass", "sand", "ice", "mud", "wood", "wild", "nature", "outdoors", "underwater",
})
# Basic colour terms: a closed class the taggers often call nouns ("red" in "a red ball standing"). A colour
# describes how a thing looks, never what it is, and is never an entity on its own.
COLOUR_WORDS = frozenset({
    "red", "orange", "yellow", "green", "blue", "purple", "violet", "pink", "brown", "black", "white", "grey",
    "gray", "gold", "golden", "silver", "beige", "teal", "turquoise", "cyan", "magenta", "maroon", "navy",
    "crimson", "scarlet", "ivory", "cream", "tan", "khaki", "olive", "lime", "indigo", "amber", "bronze",
})
# Colour words that are also things with a determiner ("an orange", "a lime", "some gold"); any other colour with a
# determiner ("a red" where a cut prompt ends) still only says how something looks.
COLOUR_THINGS = frozenset({"orange", "lime", "olive", "gold", "silver", "bronze", "cream", "ivory", "amber"})
# Times of day, seasons, weather and light: conditions rather than objects or places.
CONDITION_HEADS = frozenset({
    "sunset", "sunrise", "dawn", "dusk", "twilight", "night", "nighttime", "daytime", "day", "evening",
    "morning", "afternoon", "noon", "midnight", "spring", "summer", "autumn", "winter", "season", "weather",
    "rain", "rainfall", "downpour", "drizzle", "storm", "thunderstorm", "blizzard", "snowfall", "snowstorm",
    "snow", "fog", "mist", "haze", "wind", "breeze", "sunlight", "sunshine", "moonlight", "daylight",
    "starlight", "lightning", "hour",
})
# A time, season or weather word with the noun after it naming one thing ("snow leopard", "night club", "rain
# boots"): a casual run-on is not split between them (`candidates._condition_between_nouns`).
CONDITION_COMPOUNDS = frozenset({
    "snow leopard", "snow fox", "snow owl", "snow goose", "snow monkey", "snow globe", "snow cone", "snow angel",
    "snow boot", "snow plow", "snow blower", "snow shovel", "snow tire", "snow day", "night club", "night market",
    "night sky", "night light", "night lamp", "night owl", "night train", "night shift", "night watch",
    "night vision", "night gown", "rain boot", "rain coat", "rain jacket", "rain hat", "rain forest", "rain cloud",
    "rain drop", "rain gauge", "rain barrel", "storm drain", "storm cloud", "storm chaser", "storm trooper",
    "storm door", "fog horn", "fog machine", "fog light", "winter coat", "winter jacket", "winter hat",
    "winter boot", "summer dress", "summer camp", "summer house", "morning glory", "morning coat",
    "evening gown", "evening dress", "sunset boulevard", "lightning bolt", "lightning bug", "mist net",
    "snow suit", "snow crab", "snow pea", "snow fort", "snow sculpture", "winter market", "winter palace",
    "night heron", "night cream", "rain shower", "fog bank", "weather station", "midnight sun",
})
# Parts of a body or a thing: "the face of an old fisherman", "the tiger's eye" are shots of the owner, who is
# the main subject (the part alone matches every close-up of another owner's part).
PART_NOUNS = frozenset({
    "face", "eye", "hand", "head", "paw", "claw", "feather", "fur", "tail", "wing", "fin", "beak", "mouth", "nose",
    "lip", "ear", "hair", "skin", "scale", "horn", "mane", "hoof", "leg", "foot", "finger", "tooth", "shoulder",
    "arm", "belly", "whisker", "antler", "tusk", "wheel", "sole", "dial", "helmet", "visor", "hood", "engine",
})

# What a person is as a tag list names it after the count tag ("1girl, astronaut"): the tag is the subject too.
PERSON_ROLES = frozenset({
    "astronaut", "cosmonaut", "samurai", "ninja", "knight", "witch", "wizard", "mage", "sorcerer", "sorceress",
    "warlock", "necromancer", "druid", "shaman", "priest", "priestess", "nun", "monk", "paladin", "ranger",
    "archer", "warrior", "soldier", "gladiator", "viking", "spartan", "pirate", "cowboy", "cowgirl", "sheriff",
    "gunslinger", "bandit", "thief", "assassin", "spy", "agent", "detective", "cop", "policeman", "policewoman",
    "firefighter", "sailor", "captain", "pilot", "courier", "dj", "chef", "cook", "baker", "barista",
    "bartender", "waiter", "waitress", "maid", "butler", "nurse", "doctor", "surgeon", "scientist", "hacker",
    "gamer", "streamer", "idol", "singer", "dancer", "ballerina", "musician", "guitarist", "drummer",
    "pianist", "violinist", "skater", "skateboarder", "surfer", "snowboarder", "skier", "cyclist", "runner",
    "wrestler", "athlete", "cheerleader", "bride", "groom", "farmer", "fisherman", "hunter", "mechanic",
    "engineer", "explorer", "adventurer", "traveler", "traveller", "hiker", "climber", "diver", "swimmer",
    "photographer", "painter", "artist", "geisha", "kunoichi", "princess", "prince", "queen", "king", "emperor",
    "empress", "pharaoh", "vampire", "werewolf", "zombie", "ghost", "elf", "dwarf", "orc", "angel", "demon",
    "succubus", "mermaid", "fairy", "catgirl", "foxgirl", "android", "cyborg", "superhero", "villain", "schoolgirl",
    "schoolboy", "student", "teacher", "office worker", "salaryman", "businessman", "businesswoman",
    "police officer", "magical girl", "shrine maiden", "miko", "nomad", "merchant", "blacksmith", "alchemist",
    "rider", "jockey", "biker", "motorcyclist", "equestrian", "horseman", "horsewoman",
})

# Heads that make a landmark or a named thing of the name before them, beside the scene heads: even a coined name
# stays in the core there (`extract._core`: "the AeroBlade Tower", "the StarLink Bridge").
LANDMARK_HEADS = frozenset({"tower", "building", "statue", "gate", "monument", "memorial", "pyramid", "wall",
                            "bridge", "falls", "center", "centre", "clock", "wheel"})


def names_one_of(phrase: str, words: frozenset[str]) -> bool:
    """Whether a lowercase phrase, or its plural written with -s, is one of `words` ("astronaut", "samurais")."""
    return phrase in words or phrase.removesuffix("s") in words


# Words that make a thing a likeness of another ("teddy bear", "toy car", "carousel horse", "robotic dog"; "wax
# seal" is no seal): a compound with one of them never names the same thing as the bare head or another compound
# without it. Each joins the entity's core whatever its tag (`extract._core`), where the rule reads it. Materials
# things are really made of are not here ("chocolate cake", "cardboard box", "clay pot" are a cake, a box and a
# pot), nor words as often said of real things as of likenesses ("rocking chair", "stuffed pepper", "plush
# sofa", "inflatable boat", "miniature pony", "holographic display", "mechanical watch").
DEPICTION_WORDS = frozenset({
    "toy", "toys", "teddy", "plushie", "carousel", "origami", "lego", "gingerbread", "balloon", "wax",
    "plasticine", "statue", "sculpture", "figurine", "puppet", "doll", "model", "robot", "robotic",
    "animatronic", "cartoon", "hologram", "paper-mache", "papier-mache", "marzipan",
})

# Names of a kind that is no kind of their last noun ("a red panda" is no panda, "a hot dog" no dog, "a sea lion" no
# lion, "a baseball bat" no bat): their words join the core whatever their tags (`extract._core`: "ice cream cone",
# "cream" being a colour word), and the rule keeps an identity holding the name from matching one that holds its
# noun without it ("red panda" / "panda", "red panda cub" / "panda cub"), as it does a likeness; a "black widow
# spider" is still a spider and a "hot dog bun" a bun. The encoder cannot tell them apart: "red panda" / "panda"
# 0.85, "computer mouse" / "mouse" 0.91. Only names whose noun alone is another thing are here ("black bear", "sea
# turtle", "red fox" stay a bear, a turtle and a fox), and only names prompts rarely mean literally: "red kite" (a
# toy as often as the bird), "yellow jacket" (clothing more often than the wasp), "hot pot" and "red dwarf" are
# left out, and "hot spring" is a place (`SCENE_PHRASES`), which no object matches anyway.
NAMED_KINDS = frozenset({
    "red panda", "black widow", "hot dog", "black hole", "shooting star", "falling star", "sea lion",
    "mountain lion", "sea urchin", "sea cucumber", "sea star", "sea dragon", "sea cow", "guinea pig",
    "computer mouse", "baseball bat", "cricket bat", "ice cream cone", "traffic cone", "pine cone",
})
_NAME_NOUNS = frozenset(name.rsplit(" ", 1)[-1] for name in NAMED_KINDS)


def name_word(word: str) -> str:
    """A word as the names read it: a plural of a name's noun in the singular ("pandas", "mice"; a capitalised
    "Red Pandas" is a proper noun the lemmatiser leaves alone), anything else as it is."""
    if word == "mice":
        return "mouse"
    for cut in (1, 2):
        if word.endswith("es"[2 - cut:]) and word[:-cut] in _NAME_NOUNS:
            return word[:-cut]
    return word


def named_kinds(words: list[str]) -> dict[str, int]:
    """The kinds' names among consecutive words (read by `name_word`), each with the position of its last word."""
    read = [name_word(w) for w in words]
    return {" ".join(read[i:i + n]): i + n - 1 for n in (2, 3) for i in range(len(read) - n + 1)
            if " ".join(read[i:i + n]) in NAMED_KINDS}


@lru_cache(maxsize=65536)  # the rule tests every pair of two prompts' entities; identities recur
def kinds_differ(a: str, b: str) -> bool:
    """Whether two identities of one noun name other kinds by their words: a likeness word on one side only
    ("teddy bear" / "bear"), or a kind's name on one side whose noun the other holds without it ("red panda" /
    "panda", "red panda cub" / "panda cub", "hot-dog" / "dog"; not "black widow spider" / "spider")."""
    if frozenset(a.split()) & DEPICTION_WORDS != frozenset(b.split()) & DEPICTION_WORDS:
        return True  # whole words: "paper-mache" is a likeness word
    wa, wb = a.replace("-", " ").split(), b.replace("-", " ").split()  # a name's words apart: "hot-dog"
    na, nb = named_kinds(wa), named_kinds(wb)
    for name in na.keys() ^ nb.keys():
        other = wb if name in na else wa
        if name.rsplit(" ", 1)[-1] in {name_word(w) for w in other}:
            return True
    return False


# Kinds of place whose members look alike in a video: two scenes of one kind agree whatever their words' similarity
# ("deep sea" / "dark ocean", "field" / "meadow", "jungle" / "rainforest"; the rubric's "pine forest" / "dense
# forest"). Rooms, buildings and named places keep the similarity test.
_SCENE_KINDS = {
    "sea": ("sea", "ocean", "lagoon", "bay", "cove", "inlet", "fjord", "estuary", "reef", "atoll", "underwater"),
    "coast": ("beach", "shore", "shoreline", "seashore", "seaside", "coast", "coastline"),
    "harbour": ("harbor", "harbour", "marina", "port", "seaport", "pier", "dock", "waterfront", "boardwalk"),
    "freshwater": ("lake", "pond", "lakeside", "lakeshore"),
    "river": ("river", "stream", "creek", "riverbank", "riverside", "canal", "waterway"),
    "road": ("road", "highway", "lane", "trail", "raceway", "racetrack"),
    "street": ("street", "alley", "alleyway", "backstreet", "sidewalk", "avenue", "boulevard", "crosswalk",
               "downtown", "plaza", "square"),
    "city": ("city", "cityscape", "metropolis", "skyline", "town", "village", "hamlet", "neighborhood",
             "neighbourhood", "suburb"),
    "grassland": ("field", "meadow", "pasture", "prairie", "plain", "savanna", "savannah", "steppe", "farmland",
                  "paddy"),
    "woodland": ("forest", "woods", "woodland", "jungle", "rainforest", "grove", "glade", "thicket"),
    "mountain": ("mountain", "mountainside", "hill", "hillside", "ridge", "summit", "slope", "plateau", "valley",
                 *MOUNTAIN_RANGES),
    "gorge": ("canyon", "gorge", "ravine", "cliff", "mesa", "badlands"),
    "desert": ("desert", "dune", "oasis"),
    "ice": ("glacier", "tundra", "iceberg"),
    "wetland": ("marsh", "swamp", "wetland", "bog", "moor", "heath", "everglades"),
    "space": ("space", "galaxy"),
}
SCENE_KIND = {head: kind for kind, heads in _SCENE_KINDS.items() for head in heads}


def places_of_a_kind(head: str) -> tuple[str, ...]:
    """The scene heads of `head`'s kind of place (itself included), or () when it belongs to none."""
    kind = SCENE_KIND.get(head)
    return _SCENE_KINDS[kind] if kind is not None else ()


def same_kind_of_place(a: str, b: str) -> bool:
    """Whether two scene heads name places of one kind ("sea" / "ocean", "field" / "meadow")."""
    kind = SCENE_KIND.get(a)
    return kind is not None and kind == SCENE_KIND.get(b)


# What covers a place and sets its look: a scene of one ("snow") and a place it covers ("snowy forest") agree.
COVER_WORDS = frozenset({"snow", "ice", "frost", "fog", "mist", "haze", "sand", "mud", "dust", "rain"})
# A cover's noun says a place is covered only before one of these ("snow-covered"; not "snow globe", "snow-white").
_COVERING = ("covered", "capped", "dusted", "laden", "soaked", "shrouded", "filled", "swept", "blanketed", "clad",
             "crusted", "packed", "drenched", "frosted", "strewn", "choked", "bound")


@lru_cache(maxsize=64)
def cover_forms(cover: str) -> frozenset[str]:
    """The words that say a place is covered by `cover`: its adjectives ("snowy", "foggy", "icy", "hazy") and its
    compounds with a covering participle ("snow-covered", "fog-shrouded")."""
    forms = {f"{cover}y", f"{cover}{cover[-1]}y"} | ({f"{cover[:-1]}y"} if cover.endswith("e") else set())
    return frozenset(forms | {f"{cover}-{c}" for c in _COVERING})


def covers_named(text: str, head: str) -> frozenset[str]:
    """The covers a scene's words besides its head give it ("snowy forest" -> snow, "fog-shrouded harbour" -> fog;
    "ice cream shop", "mud hut village", "snow-white castle" -> none)."""
    words = [w for w in text.split() if w != head]
    return frozenset(c for c in COVER_WORDS if any(w in cover_forms(c) for w in words))


def scene_words_name(text: str, head: str, other_head: str) -> bool:
    """Whether a scene's words say it is covered by what the other scene is (`covers_named`): "snowy forest" /
    "snow", "snow-covered forest" / "fresh snow", "icy lake" / "ice" are one setting; "snowy forest" / "burning
    forest", a place named as a modifier ("sea cave" / "sea") and a cover's noun in another compound ("ice cream
    shop" / "ice") are not."""
    return other_head in covers_named(text, head)


_DECADE = re.compile(r"'?(?:\d|1\d\d|20\d)0s|\d+(?:fps|k|p)")
_DECADE_WORDS = frozenset({"twenties", "thirties", "forties", "fifties", "sixties", "seventies", "eighties",
                           "nineties"})


def a_decade(word: str) -> bool:
    """A decade ("1940s", "80s", "the fifties"), a frame rate or a resolution ("1000fps", "8k", "1080p"): a look,
    never a thing in the frame."""
    return word in _DECADE_WORDS or _DECADE.fullmatch(word) is not None
