"""S-NIAH, RULER's single needle in a haystack: filler prose with one sentence stating a
special magic number for a key, three distractor needles for other keys, and the question
asking for the key's number.

The text is never built up front: a task keeps the plan (which filler sentence goes where,
and where the needles sit), so a 50M-token task costs a few megabytes until written, and
`write_context` streams it to disk in blocks.
"""

from __future__ import annotations

import random
import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

CHARS_PER_TOKEN = 4
DISTRACTORS = 3
PARAGRAPH_SENTENCES = 7  # a blank line after every seventh filler sentence
_WRITE_BLOCK = 20_000  # sentences per write: about 1.6 MB of text

# Plain sentences with no digits, no hyphens and nothing magic, so that the only numbers
# and the only "special magic" phrases in a context are the needles.
FILLER = (
    "The morning train left the station a few minutes later than the timetable promised.",
    "Most of the village gardens were planted with beans, onions and a row of sunflowers.",
    "A thin layer of frost covered the windscreens of the cars parked along the street.",
    "The committee agreed to meet again after the harvest to review the accounts.",
    "Several fishing boats returned early because the wind had turned cold and strong.",
    "She kept her grandmother's recipes in a tin box on the top shelf of the pantry.",
    "The old bridge was closed for repairs, so the buses took the longer road by the river.",
    "Children from the lower school painted a mural on the wall beside the playground.",
    "The library extended its opening hours during the weeks before the examinations.",
    "A small bakery on the corner sold out of bread before the market opened.",
    "The hikers followed the ridge until the path disappeared into low cloud.",
    "Rain fell steadily through the night and filled the ditches along the lane.",
    "The museum moved its collection of maps to a quieter room on the second floor.",
    "He repaired the fence with wood salvaged from the barn that collapsed last winter.",
    "The choir rehearsed in the church hall because the heating there actually worked.",
    "Most visitors arrived by ferry and walked up the hill to the lighthouse.",
    "The new manager asked every team to write down the three problems that cost the most time.",
    "A flock of starlings wheeled over the reed beds just before sunset.",
    "The orchard produced more apples than the family could press or store.",
    "The report recommended replacing the pumps before the dry season began.",
    "Students queued outside the hall to collect their timetables for the term.",
    "The harbour master posted a warning about the strong currents near the breakwater.",
    "Her first novel was written in the evenings after long shifts at the hospital.",
    "The council voted to plant trees along both sides of the main road.",
    "A narrow staircase led from the kitchen to a room under the roof.",
    "The farmers brought their sheep down from the high pastures before the snow.",
    "The engineers tested the new valve for a week before approving the design.",
    "Every summer the town held a fair with music, games and stalls of local cheese.",
    "The river was low enough that the stepping stones showed above the water.",
    "The clock in the square had stopped, and nobody seemed to mind.",
    "The expedition carried enough food for a month and fuel for rather less.",
    "A quiet courtyard behind the hotel offered shade during the hottest hours.",
    "The bookshop kept a shelf of secondhand travel guides near the door.",
    "Workers resurfaced the car park over the long weekend while the offices were closed.",
    "The chef insisted that the soup be served hot and the bread be served fresh.",
    "An early thaw flooded the meadows and left the footpaths deep in mud.",
    "The teacher asked the class to describe the view from their bedroom windows.",
    "The shipping company added a second weekly sailing to the northern islands.",
    "Owls nested in the hollow oak at the far end of the field.",
    "The town band practised on Thursday evenings in the room above the post office.",
    "A strong smell of coffee drifted from the café across the road.",
    "The inspectors found the records in good order and the kitchen spotless.",
    "Snow closed the mountain pass for three days in the middle of the month.",
    "The painter preferred the soft light of the early morning to the glare of noon.",
    "Volunteers cleared the litter from the beach after the storm had passed.",
    "The new bicycle lanes made the ride to the university safer and quicker.",
    "A retired sailor told stories about the ports he had visited as a young man.",
    "The surveyors marked the boundary with white posts every few hundred paces.",
    "The gardeners covered the tender plants with fleece when frost was forecast.",
    "Her letters described the city as noisy, crowded and impossible not to love.",
    "The mill had been converted into flats with views across the valley.",
    "The lecture on medieval trade routes attracted a larger audience than expected.",
    "A row of cottages faced the green, each with a different coloured door.",
    "The delivery van broke down on the hill and blocked traffic for an hour.",
    "Bees were busy in the lavender that lined the path to the front door.",
    "The plans for the new school were displayed in the town hall for comment.",
    "The dog waited by the gate every afternoon for the children to come home.",
    "Fog rolled in from the sea and hid the far side of the bay.",
    "The accountant found a small error that explained the missing payments.",
    "The market square filled with stalls selling fruit, flowers and honey.",
    "He learned to sail on the lake where his father had learned before him.",
    "The power cut lasted most of the evening, so they played cards by candlelight.",
    "The restored steam engine made its first run along the coast in decades.",
    "The ferry was cancelled, and the passengers spent the night in the waiting room.",
    "Wild garlic grew thickly along the banks of the stream in spring.",
    "The architect chose local stone so the building would match its neighbours.",
    "Late in the afternoon the wind dropped and the lake became perfectly still.",
    "The hospital opened a new ward for patients recovering from surgery.",
    "A group of students organised a concert to raise money for the shelter.",
    "The path climbed steeply through the pine forest to a clearing with a view.",
    "Her brother collected old radios and repaired them in his garage.",
    "The newspaper printed a map of the flooded roads on its front page.",
    "The vineyard on the south slope ripened a week earlier than the others.",
    "The guide pointed out the marks left by glaciers on the smooth rocks.",
    "The bakery started making rye loaves after customers kept asking for them.",
    "The tram line was extended to reach the new housing on the edge of town.",
    "A heron stood motionless in the shallows, watching for fish.",
    "The meeting ran late because everyone had an opinion about the parking rules.",
    "The translator worked slowly, checking each idiom against older editions.",
    "The apple blossom came out all at once after a week of warm weather.",
    "The firm moved its offices to a converted warehouse near the docks.",
    "The night nurse made a round of the ward every hour until dawn.",
    "The village shop also served as the post office and the bus stop.",
    "Swallows returned to the barn and rebuilt their nests under the eaves.",
    "The climbers waited for the weather to clear before attempting the summit.",
    "The festival closed with fireworks over the harbour at midnight.",
    "The old map showed a road that no longer existed across the marsh.",
    "The printer jammed twice before the final copy of the contract was ready.",
    "The students measured the temperature of the pond every morning for a month.",
    "A fallen tree blocked the lane until the neighbours cut it up for firewood.",
    "The gallery hung the portraits in the order in which they were painted.",
    "The cyclists stopped at the inn for soup and a long rest by the fire.",
    "The librarian found the missing volume misfiled among the atlases.",
    "The coastal path was rerouted inland after part of the cliff gave way.",
    "The potter fired the kiln overnight and opened it the next afternoon.",
    "The storm brought down power lines across the northern half of the county.",
    "The family spent every August in a cabin by a lake in the hills.",
    "The cook used the last of the summer tomatoes to make a rich sauce.",
    "The new bridge shortened the journey to the city by almost an hour.",
    "The orchestra tuned up while the audience found their seats.",
    "The farmer rotated his crops so that the soil would not be exhausted.",
    "The school trip to the castle was the highlight of the spring term.",
    "A small boat lay upturned on the shingle, its paint faded by the sun.",
    "The council published a guide to recycling that nobody seemed to read.",
    "The pharmacist explained how often the medicine should be taken.",
    "The street musicians drew a crowd outside the station every evening.",
    "The wooden pier creaked as the tide came in beneath it.",
    "The research team spent the winter analysing samples from the glacier.",
    "The hotel served breakfast on the terrace when the weather allowed.",
    "The carpenter measured twice and cut once, as his teacher had taught him.",
    "The old railway line became a footpath and cycle route through the woods.",
    "The vet visited the farm to check on the lambs born during the storm.",
    "The town archive held letters written by the first settlers of the valley.",
    "The runners set off at dawn to avoid the heat of the day.",
    "The kitchen window looked out over a vegetable patch and a leaning shed.",
    "The conference organisers printed the programme on recycled paper.",
    "A pair of swans raised their cygnets on the pond behind the mill.",
    "The painter's studio smelled of turpentine, linseed oil and strong tea.",
    "The bus driver knew most of his passengers by name.",
    "The students argued about the ending of the novel long after the class ended.",
    "The ship's cook baked bread every morning, even in rough seas.",
    "The shepherd's hut stood alone on the hillside above the village.",
    "The town's only cinema showed old films on Sunday afternoons.",
    "A gust of wind scattered the papers across the office floor.",
    "The well in the square had been capped, but the stone rim remained.",
    "The nurses organised a rota so that someone was always on call.",
    "The path along the canal was lined with moored narrowboats.",
    "The children built a den from branches at the edge of the wood.",
    "The baker rose before dawn to light the ovens.",
    "The garden centre sold seedlings, compost and advice in equal measure.",
    "The train slowed as it crossed the viaduct high above the valley.",
    "The old sea wall was raised after the floods of the previous winter.",
    "The editor asked for shorter sentences and fewer adjectives.",
    "The orchard was fenced to keep the deer away from the young trees.",
    "The radio forecast promised a dry week, which pleased the farmers.",
    "The cathedral bells rang out across the rooftops on Sunday morning.",
    "The new telescope revealed faint details in the distant nebula.",
    "The caretaker locked the school gates at six every evening.",
    "The lake froze hard enough for skating only once in a decade.",
    "The mechanic found the fault in a loose wire behind the dashboard.",
    "The walkers sheltered in a stone hut while the hail passed over.",
    "The inn's sign swung and creaked in the wind all night long.",
    "The florist arranged the tulips in tall glass vases by the window.",
    "The estate's woodland was opened to the public for the first time.",
    "The volunteers repainted the village hall in a pale shade of green.",
    "The students compared the rainfall records of two neighbouring towns.",
    "The old lighthouse keeper's cottage is now a small museum.",
    "The evening light turned the stone walls of the town a warm gold.",
    "The delegation toured the factory and asked about its energy use.",
    "The meadow was left uncut until the wild flowers had set their seed.",
    "The fishermen mended their nets on the quay while the gulls watched.",
    "The committee thanked the volunteers and closed the meeting before ten.",
)

_COLOURS = (
    "amber",
    "azure",
    "crimson",
    "golden",
    "silver",
    "scarlet",
    "ivory",
    "cobalt",
    "emerald",
    "violet",
    "copper",
    "ochre",
    "indigo",
    "russet",
    "saffron",
    "slate",
    "coral",
    "jade",
    "olive",
    "pearl",
    "tawny",
    "cerise",
    "teal",
    "umber",
    "quiet",
    "hidden",
    "frozen",
    "distant",
    "ancient",
    "gentle",
    "hollow",
    "rapid",
)
_NOUNS = (
    "harbor",
    "meadow",
    "falcon",
    "lantern",
    "orchard",
    "glacier",
    "canyon",
    "willow",
    "compass",
    "beacon",
    "quarry",
    "thicket",
    "summit",
    "estuary",
    "prairie",
    "cavern",
    "harvest",
    "tundra",
    "lagoon",
    "citadel",
    "ember",
    "marble",
    "ravine",
    "sparrow",
    "voyage",
    "anchor",
    "bramble",
    "delta",
    "fjord",
    "garnet",
    "heron",
    "island",
)


@dataclass(frozen=True)
class Plan:
    picks: array  # index into FILLER of each filler sentence, in order
    needles: tuple[tuple[int, str], ...]  # (filler position it precedes, needle sentence)


@dataclass(frozen=True)
class GeneratedTask:
    name: str
    question: str
    expected_answer: str
    context_chars: int
    _plan: Plan = field(repr=False, compare=False)

    def context_text(self) -> str:
        return "".join(_pieces(self._plan))

    def write_context(self, path: Path) -> None:
        """Write the context as UTF-8, a block of sentences at a time."""
        pieces = _pieces(self._plan)
        with Path(path).open("w", encoding="utf-8", newline="") as out:
            while block := "".join(islice(pieces, _WRITE_BLOCK)):
                out.write(block)


def make_sniah(tokens: int, seed: int) -> GeneratedTask:
    """A single-needle task of about `tokens` tokens (4 characters each).

    The same (tokens, seed) always gives the same task, byte for byte.
    """
    if tokens < 1:
        raise ValueError(f"tokens must be positive, not {tokens}")
    # A string seed goes through sha512: stable across processes and Python versions.
    rng = random.Random(f"frlm-sniah:{tokens}:{seed}")
    keys = distinct_keys(rng, 1 + DISTRACTORS)
    values = distinct_values(rng, len(keys))
    needles = [needle_sentence(key, value) for key, value in zip(keys, values, strict=True)]
    needle_chars = sum(len(sentence) + 1 for sentence in needles)
    picks, filler_chars = pick_filler(rng, max(0, tokens * CHARS_PER_TOKEN - needle_chars))
    positions = [rng.randint(0, len(picks)) for _ in needles]
    placed = tuple(sorted(zip(positions, needles, strict=True), key=lambda item: item[0]))
    return GeneratedTask(
        name="sniah",
        question=f"What is the special magic number for {keys[0]} mentioned in the provided text?",
        expected_answer=values[0],
        context_chars=filler_chars + needle_chars,
        _plan=Plan(picks=picks, needles=placed),
    )


def score_answer(task: GeneratedTask, answer: str) -> bool:
    return answer_matches(task.expected_answer, answer)


def answer_matches(expected: str, answer: str) -> bool:
    """True if the expected number appears in the answer as a whole number; digit group
    separators ("1,234,567", "1 234 567") are forgiven."""
    joined = re.sub(r"(?<=\d)[,_ \u00a0\u202f](?=\d)", "", answer or "")
    return re.search(rf"(?<!\d){re.escape(expected)}(?!\d)", joined) is not None


def needle_sentence(key: str, value: str) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def distinct_keys(rng: random.Random, count: int) -> list[str]:
    keys: list[str] = []
    while len(keys) < count:
        key = f"{rng.choice(_COLOURS)}-{rng.choice(_NOUNS)}"
        if key not in keys:
            keys.append(key)
    return keys


def distinct_values(rng: random.Random, count: int) -> list[str]:
    values: list[str] = []
    while len(values) < count:
        value = str(rng.randint(1_000_000, 9_999_999))
        if value not in values:
            values.append(value)
    return values


def _separator(position: int) -> str:
    return "\n\n" if position % PARAGRAPH_SENTENCES == PARAGRAPH_SENTENCES - 1 else " "


def pick_filler(rng: random.Random, target_chars: int) -> tuple[array, int]:
    """Filler sentences whose text length comes closest to `target_chars`."""
    lengths = [len(sentence) for sentence in FILLER]
    mean = sum(lengths) / len(lengths) + 1.3
    picks = array("H")
    total = 0
    while total < target_chars:
        # Draw in bulk (a C loop), then walk the lengths to find where to stop.
        wanted = int((target_chars - total) / mean * 1.02) + 16
        for index in rng.choices(range(len(FILLER)), k=wanted):
            size = lengths[index] + len(_separator(len(picks)))
            if total + size > target_chars:
                # Stop on whichever side of the target is nearer.
                if total + size - target_chars < target_chars - total:
                    picks.append(index)
                    total += size
                return picks, total
            picks.append(index)
            total += size
    return picks, total


def _pieces(plan: Plan) -> Iterator[str]:
    """The context as a stream of sentences with their separators."""
    needles = iter(plan.needles)
    upcoming = next(needles, None)
    for position, index in enumerate(plan.picks):
        while upcoming is not None and upcoming[0] == position:
            yield upcoming[1] + " "
            upcoming = next(needles, None)
        yield FILLER[index] + _separator(position)
    while upcoming is not None:
        yield upcoming[1] + " "
        upcoming = next(needles, None)
