"""Prompt sets for self-distillation and evaluation: instruction templates x topics, in eleven categories.

The held-out set uses topics and texts the training set never sees, with the same categories, so evaluation
measures generalisation rather than memorised answers. Because that set still shares the training templates, a
second held-out set of free-form prompts (bench/prompts/freeform.jsonl: hand-written chats, long texts, code,
constrained instructions; never used for training) measures how the head does on prompts unlike any template."""
import json
import random
from pathlib import Path

TRAIN_TOPICS = """photosynthesis; black holes; the French Revolution; machine learning; climate change; the immune system;
volcanoes; the stock market; the Roman Empire; quantum computing; coffee; honeybees; the internet; democracy;
plate tectonics; vaccines; the moon landing; electric cars; recycling; the water cycle; dinosaurs; jazz music;
the printing press; solar panels; sleep; meditation; the human heart; rainforests; inflation; the Olympic Games;
chess; origami; the Great Wall of China; penguins; blockchain; DNA; gravity; the Renaissance; pizza; tea ceremonies;
earthquakes; the Industrial Revolution; nuclear energy; social media; the Amazon river; hurricanes; yoga;
the periodic table; whales; wind turbines; ancient Egypt; the theory of evolution; bread baking; volunteering;
public libraries; the Silk Road; coral reefs; antibiotics; robotics; the Cold War; marathon running; mushrooms;
the Moon; Mars exploration; classical music; urban gardening; time zones; the Eiffel Tower; glaciers; bicycles;
cryptography; the human brain; friendship; minimalism; deserts; the Beatles; 3D printing; vitamins; the Vikings;
tsunamis; composting; cloud computing; the Milky Way; rainbows; electricity; magnets; the Sahara; sharks; tango;
the Pyramids; video games; hydropower; the Declaration of Independence; ants; chocolate; language learning;
public speaking; remote work; the Titanic; microplastics; bees and pollination; the speed of light; sushi;
painting with watercolours; the metric system; lighthouses; owls; the stock exchange; budgeting; first aid;
kites; opera; telescopes; the Arctic; rivers; trains; the Mayan civilisation; algebra; probability; poetry;
knitting; camping; skyscrapers; elephants; fermentation; wildfires; smartphones; the Nile; satellites; ballet;
mountains; cheese making; the ocean tides; birds migration; the printing of money; submarines; sound waves;
photography; the post office; hiking safety; weather forecasting; tigers; the Internet of Things; salt; maps;
the history of writing; sugar; open source software; the bicycle chain; rain; volcanic islands; bridges""".replace("\n", " ")

MORE_TOPICS = """tomatoes; gardening in small spaces; the Great Barrier Reef; kangaroos; the Sydney Opera House; cooking rice;
job interviews; writing a CV; saving for retirement; credit cards; mortgages; taxes; small businesses; marketing;
customer service; supply chains; shipping containers; airports; air traffic control; jet engines; helicopters;
rockets; the International Space Station; Jupiter; Saturn's rings; comets; meteor showers; eclipses; the Sun;
star formation; dark matter; the Big Bang; atoms; chemical bonds; acids and bases; semiconductors;
transistors; operating systems; databases; spreadsheets; email; passwords; computer viruses; artificial intelligence;
neural networks; search engines; web browsers; HTML; the Python language; version control; unit testing; APIs;
data privacy; online shopping; streaming services; podcasts; newspapers; television; cinema; animation; comics;
novels; Shakespeare; fairy tales; mythology; Greek gods; Norse legends; the Olympics of ancient Greece; Sparta;
Julius Caesar; Cleopatra; the Middle Ages; castles; knights; the Black Death; the Magna Carta; Columbus; the Incas;
the American Civil War; World War I; World War II; the United Nations; the European Union; elections; courts;
human rights; the Red Cross; charities; universities; homework; exams; kindergarten; teachers; reading habits;
handwriting; calligraphy; sign language; dialects; the English alphabet; punctuation; grammar; vocabulary;
dictionaries; crossword puzzles; sudoku; board games; card games; playing the guitar; the piano; drums; singing;
choirs; rock music; hip hop; folk dances; salsa; theatre; magic tricks; circus acrobats; stand-up comedy;
football; basketball; tennis; swimming; cycling races; skiing; surfing; climbing; boxing; the Tour de France;
cricket; baseball; golf; table tennis; fitness; stretching; healthy breakfasts; drinking water; fruit; vegetables;
protein; fasting; allergies; the common cold; fever; headaches; dentists; eyesight; hearing; the skin; bones;
muscles; the lungs; blood; the kidneys; digestion; stress; happiness; loneliness; kindness; gratitude; patience;
motivation; habits; procrastination; time management; goal setting; teamwork; leadership; negotiation; conflict;
parenting; grandparents; pets; dogs; cats; hamsters; goldfish; horses; cows; sheep; chickens; pigs; wolves; foxes;
bears; lions; giraffes; zebras; gorillas; chimpanzees; dolphins; jellyfish; crabs; starfish; butterflies;
spiders; snakes; frogs; crocodiles; parrots; eagles; hummingbirds; bats; camels; polar bears; koalas; pandas;
oak trees; cactus plants; sunflowers; roses; seeds; soil; fertilisers; farming; tractors; irrigation; fishing;
forests; wetlands; lakes; waterfalls; caves; islands; beaches; the Himalayas; the Alps; the Grand Canyon;
Antarctica; Iceland; Japan; India; Brazil; Kenya; Canada; Mexico; Egypt today; Paris; London; New York; Tokyo;
Rome; Venice; Istanbul; Cairo; Rio de Janeiro; Beijing; cities at night; traffic jams; public transport; subways;
cars; motorcycles; ships; sailing; canals; roads; tunnels; dams; houses; apartments; furniture; kitchens;
cleaning; laundry; cooking pasta; baking cakes; soup; salads; spices; olive oil; honey; ice cream; coffee shops;
restaurants; street food; vegetarian diets; food waste; plastic bags; air pollution; noise pollution; ozone;
acid rain; endangered species; national parks; zoos; museums; art galleries; sculpture; architecture; pottery;
sewing; woodworking; drawing; comic strips; fashion; jeans; shoes; hats; jewellery; perfume; soap; toothpaste;
clocks; calendars; birthdays; weddings; holidays; New Year traditions; festivals; fireworks; gifts; letters;
postcards; stamps; coins; banks; money; savings accounts; prices; shopping lists; markets; advertising; brands;
inventions; Thomas Edison; Marie Curie; Albert Einstein; Isaac Newton; Leonardo da Vinci; Ada Lovelace;
Charles Darwin; Galileo; Nikola Tesla; the wheel; paper; steel; concrete; plastic; rubber; cotton;
silk; gold; diamonds; oil; natural gas; coal; hydrogen; nuclear fusion; energy saving; light bulbs; refrigerators;
microwaves; washing machines; vacuum cleaners; drones; self-driving cars; virtual reality; smart watches;
headphones; cameras; printers; keyboards; the mouse; touch screens; Wi-Fi; Bluetooth; GPS; weather; snow;
fog; thunderstorms; lightning; tornadoes; droughts; floods; seasons; spring; autumn; the night sky; sunrise""".replace("\n", " ")

HELDOUT_TOPICS = """the Hubble telescope; octopuses; the Ottoman Empire; desalination; bamboo; the Hanseatic League;
lichens; the Doppler effect; hot air balloons; the Andes; lithium batteries; the Byzantine Empire; seahorses;
carbon capture; the Aztec calendar; harmonicas; geothermal energy; the Panama Canal; fireflies; the abacus;
sourdough starters; sea turtles; the Fibonacci sequence; aurora borealis; wool; the Suez Canal; stained glass;
radio waves; beekeeping; the Gobi desert""".replace("\n", " ")

TEMPLATES = {
    "question": ["What is {t}?", "Why is {t} important?", "How does {t} work?", "What are the main facts about {t}?",
                 "Who should learn about {t}, and why?", "What is a common misconception about {t}?",
                 "When did people first start studying {t}?", "What would happen if {t} disappeared?"],
    "explanation": ["Explain {t} to a ten-year-old.", "Explain {t} in one paragraph.",
                    "Give a short, clear explanation of {t}.", "Describe {t} in simple terms.",
                    "Explain the history of {t} briefly.", "Explain how {t} affects everyday life."],
    "list": ["List five facts about {t}.", "Give three reasons to care about {t}.",
             "List the pros and cons of {t}.", "Name four things everyone should know about {t}.",
             "Write a numbered list of tips related to {t}.", "List three questions a student might ask about {t}."],
    "code": ["Write a Python function that returns a fun fact about {t}.",
             "Write a Python class that stores notes about {t}.",
             "Write a short Python script that prints a quiz question about {t}.",
             "Write a JavaScript function that counts words in a sentence about {t}.",
             "Write a SQL table definition for a database of {t} facts.",
             "Write a Python function that sorts a list of numbers, with a comment mentioning {t}."],
    "rewriting": ["Rewrite this sentence to be more formal: '{s}'", "Rewrite this in simpler words: '{s}'",
                  "Make this sentence more exciting: '{s}'", "Fix the grammar in this sentence: '{s}'",
                  "Translate this sentence into plain English for a child: '{s}'"],
    "summarising": ["Summarise in one sentence: '{p}'", "Give a short summary of this text: '{p}'",
                    "What is the main idea of this passage? '{p}'", "Summarise this for a busy reader: '{p}'"],
    "classification": ["Is the following review positive or negative? '{r}'",
                       "Classify the sentiment of this text as positive, negative or neutral: '{r}'",
                       "Is this message spam or not spam? '{m}'", "Which topic is this sentence about: '{s}'",
                       "Is this statement a fact or an opinion? '{o}'"],
    # Free-form styles users actually send: creative asks, advice, short messages, comparisons, definitions.
    "creative": ["Write a haiku about {t}.", "Write a short poem about {t}.", "Write a limerick about {t}.",
                 "Write a three-sentence story about {t}.", "Suggest a catchy name for a shop inspired by {t}.",
                 "Write a slogan for a campaign about {t}.", "Write a short, funny joke about {t}."],
    "advice": ["Give me three tips for learning about {t}.", "How can I get started with {t}?",
               "What should a beginner know about {t}?", "What mistakes do people often make with {t}?",
               "What should I pack for a weekend trip to see {t}?", "How can I explain {t} to my grandparents?"],
    "message": ["Write a short, polite email inviting a friend to a talk about {t}.",
                "Write a brief message asking a teacher for help with {t}.",
                "Write a friendly email declining an invitation to a workshop on {t}.",
                "Write a two-sentence thank-you note to someone who taught me about {t}."],
    "comparison": ["What is the difference between {t} and {u}?", "Compare {t} and {u} in two sentences.",
                   "Give a one-sentence definition of {t}.", "Explain {t} in two sentences.",
                   "What do {t} and {u} have in common?"],
}

_SENTENCE = ["{T} is something many people find interesting.", "i think {t} are really cool and stuff",
             "Scientists have studied {t} for many years.", "we was learning about {t} in class yesterday",
             "{T} can change the way we live.", "Nobody really understands {t} completely."]
_PASSAGE = ["{T} has a long history. Over time, people have learned more about it, and today it plays a role in "
            "science, culture and daily life. Many experts believe there is still much to discover.",
            "People often talk about {t}. Some think it is simple, but it is actually complex. Learning about it "
            "helps us understand the world, and schools teach it to students of all ages."]
_REVIEW = ["I loved the documentary about {t}, it was fantastic!", "The book on {t} was boring and too long.",
           "The museum exhibit about {t} was okay, nothing special.", "Terrible guide to {t}. Waste of money.",
           "This course on {t} changed my life. Highly recommended."]
_MESSAGE = ["Congratulations! You won a free trip to learn about {t}. Click here now!",
            "Hi, can we meet tomorrow to discuss our project on {t}?",
            "URGENT: your account about {t} will be closed, send your password today.",
            "Thanks for the notes on {t}, see you in class."]
_OPINION = ["{T} is the most beautiful thing in the world.", "{T} was first studied more than a hundred years ago.",
            "Everyone should spend more time learning about {t}."]


BASE_TEXTS = dict(s=_SENTENCE, p=_PASSAGE, r=_REVIEW, m=_MESSAGE, o=_OPINION)

# Training only (the held-out set keeps the original templates and texts, so heads stay comparable across rounds):
# more ways of asking, and a few more texts to rewrite and classify.
EXTRA_TEMPLATES = {
    "question": ["Can you tell me something surprising about {t}?", "How has {t} changed over the last century?",
                 "what r the basics of {t}", "Is {t} good or bad for the environment?"],
    "explanation": ["I don't understand {t}. Can you explain it step by step?", "Explain {t} using an analogy.",
                    "Explain {t} like I am a university student."],
    "list": ["Give me a checklist for a project about {t}.", "List some words related to {t}.",
             "What are the top three things to see or do related to {t}?"],
    "code": ["Write a Python dictionary with three facts about {t}.",
             "Write a bash command that creates a folder named after {t}.",
             "Write a Python function that checks whether a word about {t} is a palindrome.",
             "Explain what this Python line does: print(len('{t}'))"],
    "rewriting": ["Rewrite this sentence as a question: '{s}'", "Paraphrase this sentence: '{s}'",
                  "Make this sentence shorter: '{s}'"],
    "summarising": ["Summarise this text in three bullet points: '{p}'", "TL;DR: '{p}'"],
}
EXTRA_TEXTS = {
    "s": ["My brother knows everything about {t}, which is annoying at dinner.",
          "The report on {t} will be finished by Friday.", "there is alot of things to learn about {t}"],
    "r": ["The app about {t} keeps crashing and support never answers.",
          "Great podcast on {t}, although the episodes are a bit long."],
}


def _fill(template, topic, other, rng, texts):
    T = topic[0].upper() + topic[1:]
    return template.format(t=topic, u=other, **{k: rng.choice(xs).format(t=topic, T=T) for k, xs in texts.items()})


def _topics(text):
    return [t.strip() for t in text.split(";") if t.strip()]


def _make(topics, n, seed, extra=False):
    rng = random.Random(seed)
    templates = {c: ts + (EXTRA_TEMPLATES.get(c, []) if extra else []) for c, ts in TEMPLATES.items()}
    texts = {k: xs + (EXTRA_TEXTS.get(k, []) if extra else []) for k, xs in BASE_TEXTS.items()}
    cats = list(templates)
    seen, out = set(), []
    while len(out) < n:
        cat = cats[len(out) % len(cats)]  # balanced categories
        t, u = rng.sample(topics, 2)
        p = _fill(rng.choice(templates[cat]), t, u, rng, texts)
        if p not in seen:
            seen.add(p)
            out.append({"category": cat, "prompt": p})
    return out


TRAINING_PROMPTS = 3000  # the default training set's size (eagle3.train --prompts)


def training_prompts(n=TRAINING_PROMPTS, seed=0):
    return _make(_topics(TRAIN_TOPICS) + _topics(MORE_TOPICS), n, seed, extra=True)


def heldout_prompts(n=88, seed=1):
    return _make(_topics(HELDOUT_TOPICS), n, seed)


FREEFORM_PATH = Path(__file__).resolve().parent.parent / "bench" / "prompts" / "freeform.jsonl"


def freeform_prompts(path=FREEFORM_PATH):
    """The free-form held-out set: dicts with id, style and prompt (a string, or a chat as a list of messages)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [dict(id=r["id"], style=r["style"], prompt=r.get("messages") or r["prompt"]) for r in rows]


def evaluation_prompts(which="template"):
    """A held-out set by name: "template" (heldout_prompts) or "freeform" (freeform_prompts)."""
    return {"template": heldout_prompts, "freeform": freeform_prompts}[which]()
