"""The family's vocabulary, split once and for all into training and held-out nouns.

Every identifier a generated task defines (file, functions, parameters, constants, test names)
and every string value it uses is built from nouns of its split's pool, always joined with an
affix (`count_mango`, `MANGO_RATE`, `mango_rules.py`), never a bare noun. So no held-out name can
occur as a whole word anywhere in a training task, whatever the seed: the split is fixed here,
not drawn at generation time.
"""

from __future__ import annotations

import keyword

__all__ = ["HELDOUT_NOUNS", "SPLITS", "TRAIN_NOUNS", "nouns_for"]

# Concrete, short, lowercase nouns; no word is another's plural.
_NOUNS = """
acorn adder alloy amber anchor anvil apple apron arch arrow aspen atlas attic auger badge bagel
baker ballot banjo banner barge barley barrel basil basket baton beacon beaker bean beetle bell
bench berry bicycle biscuit blanket blender bloom boat bobbin bolt bonnet booth boulder bowl
bracket branch brick bridge bristle brook broom bucket buckle bugle bulb bundle buoy butter button
cabin cable cactus cake camel camera canal candle canoe canvas canyon carpet carrot cart castle
cedar cellar chalk chapel cherry chess chimney chisel cider cinder circus citrus clamp clover coach
cobalt cocoa comet compass cookie copper coral cork cotton cradle crane crayon cricket crown
cupboard curtain cushion daisy dagger dairy delta denim desk dial diamond dinghy dock dolphin
donkey dragon drawer drum dune eagle easel ember engine falcon fennel ferry fiddle finch flag
flask fleece flute forge fossil fountain fox fridge frost garlic gazebo geyser ginger glacier
glove goblet gondola gourd granite grape gravel griddle guitar gull hammer harbor harp hatch hazel
hedge helmet heron hinge hive honey hoof hornet hut igloo ink iris ivory jacket jade jar jasmine
jelly jetty jigsaw juniper kayak kettle kiln kite kiwi knapsack ladder ladle lagoon lantern larch
latch laurel lemon lentil lever lily lime linen lizard llama lobster locket loom lotus lute magnet
mallet mango maple marble marsh meadow melon mint mitten moat molar mortar moss mule muffin mural
nectar needle nest nickel nutmeg oak oar oasis olive onion orchard orchid otter oven owl oyster
paddle pagoda palette panda pantry papaya parcel parsley pasta peach peanut pebble pelican pepper
pewter piano pickle pigeon pillow pine pistachio plank plum pocket pollen pony poplar porch potato
pottery prism pulley pumpkin puppet quail quartz quill quilt rabbit radish raft raisin rake raven
reed ribbon rivet robin rocket rope rudder saddle saffron salmon sandal satchel saucer scarf
scooter shovel sickle silo skiff sled sleeve sloop spindle spoon spruce squash stable starling
stencil stool stove sundial swan tablet tack tangerine teapot tent thimble thistle thrush tiger
timber toffee tractor trellis trowel trumpet tulip tunnel turnip turtle tweed umbrella urchin
valley vanilla velvet violin walnut walrus wand wagon walrus wharf whistle willow windmill wombat
yacht yarn yeti yogurt zebra zeppelin zinnia
"""

# Every fifth noun (in sorted order) is held out: 20% of the vocabulary, spread over the alphabet.
_ALL = sorted(set(_NOUNS.split()))
HELDOUT_NOUNS: tuple[str, ...] = tuple(noun for i, noun in enumerate(_ALL) if i % 5 == 2)
TRAIN_NOUNS: tuple[str, ...] = tuple(noun for i, noun in enumerate(_ALL) if i % 5 != 2)
SPLITS = ("train", "heldout")

assert not any(keyword.iskeyword(noun) for noun in _ALL)
assert all(noun.isidentifier() and noun.isascii() and noun.islower() for noun in _ALL)


def nouns_for(split: str) -> tuple[str, ...]:
    if split == "train":
        return TRAIN_NOUNS
    if split == "heldout":
        return HELDOUT_NOUNS
    raise ValueError(f"unknown split {split!r}; one of {SPLITS}")
