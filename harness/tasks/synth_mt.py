"""synth_mt: a synthetic translation pair from a small grammar, with gold word alignments.

Source (English-like, SVO):   DET ADJ* NOUN  VERB  DET ADJ* NOUN  (PREP DET ADJ* NOUN)*
Target (verb-final, SOV):     NOUN ADJ* ga   NOUN ADJ* wo   (NOUN ADJ* PREP)*   VERB [ta]

What makes it a translation problem rather than a copy with a dictionary:
- reordering: the verb moves to the end, adjectives follow their noun, prepositions become postpositions;
- one-to-many: a past-tense verb becomes a stem plus the tense word `ta`;
- many-to-one: a two-word compound noun ("police officer") becomes one target word;
- unaligned words: source determiners have no translation, target case markers `ga` / `wo` no source.

Length is the number of source words, at least 5 ("the dog sees a cat")."""

from __future__ import annotations

import numpy as np

from ablate.harness.tasks.base import Example, TaskData, Vocab, longest_target
from ablate.harness.tasks.synthetic import sample_splits
from ablate.schema.task_config import TaskConfig

DETERMINERS = ("the", "a", "every", "this")
NOUNS = {
    ("dog",): "inu", ("cat",): "neko", ("bird",): "tori", ("fox",): "kitsu", ("horse",): "uma",
    ("child",): "kodo", ("teacher",): "sensa", ("farmer",): "nofu", ("king",): "oosa", ("girl",): "shojo",
    ("police", "officer"): "keikan", ("fire", "truck"): "shobo", ("ice", "cream"): "aisu",
    ("school", "bus"): "gakubas",
}  # fmt: skip
ADJECTIVES = {
    "big": "ooki", "small": "chisa", "red": "aka", "blue": "ao", "old": "furu", "young": "waka",
    "happy": "ureshi", "angry": "ikari",
}  # fmt: skip
VERBS = {  # (present, past) -> stem
    ("sees", "saw"): "mi", ("chases", "chased"): "oi", ("finds", "found"): "mitsu",
    ("helps", "helped"): "tasu", ("follows", "followed"): "shitai", ("calls", "called"): "yobu",
}  # fmt: skip
PREPOSITIONS = {"with": "de", "near": "soba", "behind": "ushiro", "under": "shita"}
SUBJECT, OBJECT, PAST = "ga", "wo", "ta"

SIMPLE_NOUNS = [n for n in NOUNS if len(n) == 1]
COMPOUND_NOUNS = [n for n in NOUNS if len(n) == 2]

MAX_ADJECTIVES = 3  # per noun phrase
SHORTEST = 5  # DET NOUN VERB DET NOUN


class Sentence:
    """Source and target built side by side, recording (source index, target index) links."""

    def __init__(self):
        self.src: list[str] = []
        self.tgt: list[str] = []
        self.links: list[tuple[int, int]] = []

    def add(self, src_words: tuple[str, ...], tgt_words: tuple[str, ...]) -> list[int]:
        """Source words translated by target words, every one linked to every one (either side may be
        empty: an unaligned word). Returns the target words' build positions."""
        src_start, tgt_start = len(self.src), len(self.tgt)
        self.src.extend(src_words)
        self.tgt.extend(tgt_words)
        self.links.extend(
            (src_start + i, tgt_start + j) for i in range(len(src_words)) for j in range(len(tgt_words))
        )
        return list(range(tgt_start, len(self.tgt)))

    def example(self, tgt_order: list[int]) -> Example:
        """The example with target words rearranged: tgt_order[j] is the built position of word j."""
        new_index = {old: new for new, old in enumerate(tgt_order)}
        links = sorted((s, new_index[t]) for s, t in self.links)
        return Example(tuple(self.src), tuple(self.tgt[i] for i in tgt_order), tuple(links))


def noun_phrase_slots(rng: np.random.Generator, extra: int, phrases: int) -> list[tuple[int, bool]]:
    """(adjective count, compound?) per noun phrase, spending exactly `extra` additional words."""
    slots = [(p, kind) for p in range(phrases) for kind in ["adj"] * MAX_ADJECTIVES + ["compound"]]
    chosen = [slots[i] for i in rng.choice(len(slots), size=extra, replace=False)]
    return [
        (sum(1 for q, k in chosen if q == p and k == "adj"), (p, "compound") in chosen)
        for p in range(phrases)
    ]


def sample_sentence(rng: np.random.Generator, length: int) -> Example:
    extra = length - SHORTEST
    # Each prepositional phrase adds 3 words; the rest are adjectives and compound nouns, at most
    # MAX_ADJECTIVES + 1 per noun phrase.
    feasible = [m for m in range(extra // 3 + 1) if extra - 3 * m <= (MAX_ADJECTIVES + 1) * (2 + m)]
    n_pps = int(rng.choice(feasible))
    phrases = noun_phrase_slots(rng, extra - 3 * n_pps, 2 + n_pps)
    past = bool(rng.random() < 0.5)

    def pick(options):
        options = list(options)
        return options[rng.integers(len(options))]

    sentence = Sentence()

    def noun_phrase(adjectives: int, is_compound: bool) -> list[int]:
        """Adds DET ADJ* NOUN; returns its target positions in target order (noun, then adjectives)."""
        sentence.add((pick(DETERMINERS),), ())
        adjective_positions = []
        for word in rng.choice(list(ADJECTIVES), size=adjectives, replace=False):
            adjective_positions += sentence.add((str(word),), (ADJECTIVES[word],))
        noun = pick(COMPOUND_NOUNS if is_compound else SIMPLE_NOUNS)
        return sentence.add(noun, (NOUNS[noun],)) + adjective_positions

    subject = noun_phrase(*phrases[0]) + sentence.add((), (SUBJECT,))
    forms = pick(VERBS)
    verb = sentence.add((forms[past],), (VERBS[forms], PAST) if past else (VERBS[forms],))
    obj = noun_phrase(*phrases[1]) + sentence.add((), (OBJECT,))
    adjuncts = []
    for p in range(n_pps):
        prep = pick(PREPOSITIONS)
        postposition = sentence.add((prep,), (PREPOSITIONS[prep],))
        adjuncts += noun_phrase(*phrases[2 + p]) + postposition
    return sentence.example(subject + obj + adjuncts + verb)


def synth_mt_task(cfg: TaskConfig, seed: int) -> TaskData:
    splits = sample_splits("synth_mt", sample_sentence, cfg, seed, shortest=SHORTEST)
    src_words = [
        *DETERMINERS,
        *(w for n in NOUNS for w in n),
        *ADJECTIVES,
        *(f for v in VERBS for f in v),
        *PREPOSITIONS,
    ]
    tgt_words = [
        *NOUNS.values(),
        *ADJECTIVES.values(),
        *VERBS.values(),
        *PREPOSITIONS.values(),
        SUBJECT,
        OBJECT,
        PAST,
    ]
    return TaskData(
        "synth_mt", splits, Vocab(src_words), Vocab(tgt_words),
        train_max_len=longest_target(splits["train"]), is_text=True,
    )  # fmt: skip
