"""Text for whole-model parity tests: original English prose and short prompts.

PARITY_TEXT is a few thousand words written for these tests (stories, dialogue, instructions, lists, figures), so
teacher-forced comparisons see varied, natural token statistics. PROMPTS are short openings for greedy generation.
"""

PARITY_TEXT = """\
The ferry to Harrow Point leaves the mainland twice a day, at a quarter past seven in the morning and again at \
half past four in the afternoon. In winter the second crossing is often cancelled, because the wind comes round \
the headland without warning and the harbour master, a careful woman named Ines Calloway, does not like to gamble \
with other people's evenings. She keeps a chalkboard by the ticket window. On it she writes the sea state, the \
temperature of the water, and one sentence of advice that changes every day. This morning it said: "Bring a \
scarf, even if you think you will not need it."

Most of the passengers were regulars. There was the baker's delivery van, loaded with forty loaves and a crate of \
currant buns, and a retired schoolteacher who crossed every Tuesday to visit her brother. There were two students \
with a telescope in a padded case, hoping for clear skies over the island, where there are no street lamps at all. \
And there was a man nobody recognised, who stood at the rail for the entire forty-minute crossing and wrote in a \
small green notebook without once looking at the water.

"He's a surveyor," said the baker's driver, whose name was Tomasz. "You can tell by the boots."

"Or a poet," said the schoolteacher. "Poets wear boots too."

"Not boots like that. Those have steel toes. Nobody needs steel toes to write a poem."

The schoolteacher laughed and admitted that he had a point. When the ferry bumped against the jetty, the stranger \
closed his notebook, tucked it into his coat, and walked up the hill toward the old lighthouse without asking \
anyone for directions. By lunchtime half the island had an opinion about him, and by dinner the other half did too.

---

How to make a simple loaf of bread at home

You will need 500 grams of strong white flour, 7 grams of dried yeast, 10 grams of salt, 320 millilitres of \
lukewarm water, and a tablespoon of olive oil. The quantities matter more than the brands. A kitchen scale is \
worth far more than a good mixing bowl.

1. Mix the flour, yeast and salt in a large bowl. Keep the salt and the yeast on opposite sides at first, since \
salt in direct contact can slow the yeast down.
2. Add the water and the oil, then stir with a wooden spoon until there is no dry flour left.
3. Tip the dough onto a clean surface and knead it for about ten minutes. It will start sticky and become smooth \
and springy. If you press it with a finger, the dent should slowly fill back in.
4. Put the dough back in the bowl, cover it with a damp towel, and leave it somewhere warm for an hour, or until \
it has roughly doubled in size.
5. Knock the air out, shape the dough into a tight oval, and place it on a floured baking tray. Let it rise again \
for 45 minutes.
6. Heat the oven to 220 degrees Celsius. Slash the top of the loaf with a sharp knife and bake for 30 to 35 \
minutes. It is done when the base sounds hollow when you tap it.
7. Let it cool on a rack for at least twenty minutes before slicing, however tempting it smells.

A common mistake is to add extra flour whenever the dough feels sticky. Resist this. Wet dough makes lighter \
bread, and the stickiness fades as the gluten develops.

---

Why the tide comes in twice a day

Many people assume the tide rises because the Moon pulls the water toward it, and that is part of the story, but \
it does not explain why most coasts see two high tides a day rather than one. The answer lies in the difference \
between how strongly the Moon pulls on different parts of the Earth. The ocean on the side facing the Moon is \
pulled a little more than the centre of the planet, so it bulges toward the Moon. The ocean on the far side is \
pulled a little less than the centre, so, relative to the centre, it is left behind and bulges outward in the \
opposite direction. As the Earth turns, a given stretch of coast passes through both bulges, and so it sees two \
high tides and two low tides in a little more than twenty-four hours. The extra fifty minutes or so come from the \
Moon moving along its own orbit while the Earth spins.

The Sun has the same effect, though it is weaker, at a bit less than half the strength of the Moon's. When the \
Sun and Moon line up, at new moon and full moon, their effects add together and produce spring tides, which have \
nothing to do with the season. When they pull at right angles, during the quarter moons, the tides are smaller; \
these are called neap tides. Local geography then shapes everything. In some narrow bays the water rises by more \
than ten metres, while parts of the Mediterranean barely notice the tide at all.

---

Minutes of the Riverside Allotment Association, monthly meeting

Present: eleven members, including the chair, the treasurer and the secretary. Apologies from Mr Okafor, who is \
recovering from a sprained wrist, and from the Henderson twins, who are on holiday.

Item one: the water butts. The treasurer reported that six of the twenty water butts are cracked and will not \
survive another summer. Replacements cost 38 pounds each, or 200 pounds for a pack of six from the supplier on \
Mill Lane. After some discussion the members voted nine to two in favour of buying the pack.

Item two: the shared shed. Several members have complained that the shed has become untidy, and that tools are \
not being returned. Mrs Patel proposed a simple sign-out sheet on a clipboard by the door. Mr Lindqvist asked \
whether anyone would actually use it. Mrs Patel replied that people use things when they are easy and visible, \
and that a clipboard is both. The proposal was carried.

Item three: the autumn show. The show will be held on the second Saturday of September. Categories this year \
will include heaviest marrow, longest runner bean, best jar of jam, and, at the request of the younger members, \
strangest-looking vegetable. Judging will begin at two o'clock sharp.

Any other business: someone has been leaving slug pellets near the pond, which is home to a family of frogs. \
Members are reminded that pellets are not permitted on the site.

The meeting closed at 8:47 in the evening. The next meeting will be held on the first Thursday of next month.

---

A conversation at the bicycle repair shop

"It makes a clicking noise," said the customer, lifting the bike onto the counter. "Every time I pedal. Click, \
click, click. It is driving me slowly mad."

The mechanic, a tall man with grease on both forearms, spun the pedal backwards and listened. "Does it click when \
you're coasting, or only when you push?"

"Only when I push. Harder on hills."

"Then it's probably not the chain. Could be the bottom bracket, could be a loose pedal, could be the crank bolt. \
Sometimes it's just a dry seat post, believe it or not. The noise travels through the frame and you can't tell \
where it's coming from."

"How long will it take to find out?"

"Ten minutes if I'm lucky. An afternoon if I'm not." He smiled. "Leave it with me. I'll ring you before I \
replace anything, so there are no surprises on the bill."

The customer hesitated. "How much is a bottom bracket, roughly?"

"The part is about twenty-five. Labour is another thirty. But let's not buy trouble before it arrives."

At half past three the phone rang. The problem had been the pedal, which was slightly loose in the crank. The \
mechanic had taken it out, greased the thread, and tightened it properly. The total came to eight pounds, and the \
customer was so pleased that she bought a new bell as well.

---

Notes on honeybees, for a school project

A honeybee colony in summer might contain forty thousand to sixty thousand workers, a few hundred drones, and a \
single queen. The workers are all female. Their jobs change as they age: a young worker cleans cells and feeds \
larvae, a slightly older one builds wax comb and guards the entrance, and only in the last two or three weeks of \
her life does she fly out to gather nectar and pollen. A summer worker lives for about six weeks. Workers born in \
autumn can survive for several months, because they do not spend the winter flying.

Bees tell each other where food is by dancing. A forager returning from a good patch of flowers walks in a figure \
of eight on the vertical comb, waggling her body along the straight middle part. The angle of that straight run, \
measured from vertical, matches the angle between the Sun and the food source. The length of the waggle tells \
the other bees roughly how far away it is. It is one of the few known cases of an animal communicating the \
location of something it cannot see at the moment.

To make a single kilogram of honey, the bees of a colony may visit millions of flowers and fly a distance \
equivalent to several trips around the Earth. Honey keeps for an extraordinary length of time because it holds \
very little water and is slightly acidic, which makes it hostile to most microbes.

---

The lighthouse on Harrow Point had not been lit since 1994, when the automatic beacon on the outer rocks made it \
unnecessary. The council had tried to sell it twice. The first buyer pulled out when he learned what it would cost \
to repair the roof. The second wanted to turn it into a hotel with twelve rooms, which was impossible, since the \
tower is only four metres across on the inside and has one room on each of its five floors.

So when the stranger with the green notebook climbed the hill and knocked on the door of the keeper's cottage, \
the only person there to answer was old Mr Abernathy, who had kept the light for thirty-one years and still held \
a key, mostly out of habit.

"I'm from the county records office," the stranger said. "My name is Rafael Osei. I've been asked to measure the \
tower before the council decides what to do with it."

"Measure it for what?"

"For the truth, mostly. Everyone has a different number for how tall it is. The old guidebook says twenty-six \
metres. The council's insurance form says twenty-two. The plaque by the door says eighty feet, which is neither."

Mr Abernathy considered this. "It's twenty-four and a half metres to the gallery rail," he said. "I painted that \
rail every spring for three decades. I know exactly how far it is to the ground. I counted the steps more times \
than I can tell you. There are one hundred and eleven."

Rafael opened the green notebook and wrote it down. Then, because he was careful, he asked if he could climb the \
steps and count them himself. Mr Abernathy handed him the key and said he would put the kettle on.

There were one hundred and twelve steps. Rafael came back down and said so, and the old man looked at him for a \
long moment before bursting into laughter. "The bottom one," he said. "I never counted the bottom one. It's \
hardly a step at all, it's more of a threshold. Put down one hundred and twelve. You're the one with the boots."

---

A short list of things to pack for a weekend of walking in the hills

- A waterproof jacket, even if the forecast is sunny.
- Two pairs of socks per day. Wet feet end more trips than sore legs do.
- A paper map and a compass. Phones run out of battery, and signal vanishes in valleys.
- At least two litres of water, and more in hot weather.
- Food that does not crush easily: nuts, dried fruit, hard cheese, oatcakes.
- A small first aid kit with plasters, blister pads, and a pair of tweezers.
- A head torch, in case the walk takes longer than you planned, which it usually does.
- A warm hat. You lose less heat through your head than the old saying claims, but a hat still helps.

Tell someone where you are going and when you expect to be back. It takes one minute and it can save a great deal \
of worry, or more.

---

Dear Aunt Miriam,

Thank you so much for the birthday parcel. The scarf is beautiful, and I have worn it every day this week, \
including, I am slightly embarrassed to admit, once indoors because the heating in our flat broke down on Monday. \
The landlord says the engineer will come on Friday, which means we will have spent five days in coats. My \
flatmate has started doing push-ups every hour to stay warm. I have started drinking tea at a rate that is \
probably not healthy.

Work is going well. I was moved to the new project in March, the one building a booking system for the three \
clinics in the north of the city. It sounds dull when I describe it, but it is the most interesting thing I have \
done so far, because the clinics all have different rules and none of them are written down. I spend half my time \
writing software and the other half asking receptionists how things really work. They always know. It is never \
what the official document says.

I hope your knee is better and that you have managed to get back into the garden. Mum says the apple tree had its \
best year ever, and that you gave away so many apples that the neighbours started hiding when they saw you coming \
with a basket. I would like to hear your side of that story.

I will visit at the end of the month, probably on the 27th, if the trains are running. I will bring biscuits.

With love,
Daniel

---

An explanation of compound interest, with numbers

Suppose you put 1,000 pounds into an account that pays 5 percent interest a year, and you leave the interest in \
the account rather than taking it out. After one year you have 1,050 pounds. After the second year, you earn 5 \
percent not on the original 1,000 but on the full 1,050, so you gain 52.50 and finish with 1,102.50. After ten \
years the balance is about 1,628.89, and after twenty years it is about 2,653.30. The growth speeds up because \
each year's interest itself earns interest in the years that follow.

A handy rule of thumb is the rule of 72: divide 72 by the yearly interest rate to estimate how many years it takes \
for money to double. At 6 percent, it takes about 12 years. At 9 percent, about 8. The rule works in reverse for \
debt, which is the less cheerful side of the same arithmetic. A loan at 18 percent doubles in roughly four years \
if nothing is paid off.

---

The storm arrived on the island a little after nine that night. It began as a steady rain and became, within the \
hour, something closer to a wall of water moving sideways. The power failed at ten. Across the island, people lit \
candles, found torches, and told one another that it was nothing they had not seen before, which was true, though \
it did not make the wind any quieter.

At the keeper's cottage, Mr Abernathy and Rafael Osei sat at the kitchen table with a storm lantern between them. \
The ferry had been cancelled, of course, and Rafael had accepted the offer of the spare room.

"Does the new beacon ever fail?" Rafael asked.

"Twice in twenty years. Once in a storm like this one, and once because a gull built a nest on the solar panel." \
The old man shook his head. "They sent a technician out on a boat for that. He was very angry with the gull."

Just after midnight there was a knock at the door. It was the two students with the telescope, soaked to the \
skin. They had set up on the cliff path hoping to see a meteor shower before the clouds arrived, had misjudged \
the weather badly, and had seen the light of the lantern in the window. Mr Abernathy gave them towels and soup \
and the last of the good biscuits, and the four of them stayed up until two in the morning telling stories about \
the worst weather they had ever known.

In the morning the sky was scrubbed clean and pale blue. The sea was still grey and restless, but the ferry ran \
at half past four, and Ines Calloway's chalkboard said: "Yesterday was a lesson. Today is a gift. Mind the \
puddles."

---

Questions and answers about sleep

How much sleep does an adult need? Most adults do best with seven to nine hours a night, although a small number \
of people genuinely need less. Teenagers generally need more, often eight to ten hours, and their natural sleep \
time tends to shift later, which is why early school starts are hard for them.

Is it possible to catch up on lost sleep at the weekend? Partly. A long lie-in can reduce some of the tiredness \
built up over a week of short nights, but it does not fully undo the effects on attention and mood, and a very \
irregular schedule can make it harder to fall asleep on Sunday night.

Why do we feel groggy after a nap? If a nap lasts longer than about thirty minutes, you may wake from deep sleep, \
and the heavy, confused feeling that follows is called sleep inertia. It usually passes within fifteen to thirty \
minutes. Short naps of ten to twenty minutes tend to avoid it.

Does looking at screens before bed really matter? Bright light in the evening, especially bluish light, can delay \
the body's internal clock a little. The bigger problem is often what is on the screen: an exciting film, a \
stressful message, or a game that is hard to put down keeps the mind alert when it should be winding down.

---

Rafael Osei's report to the county records office was four pages long. It listed the height of the tower as \
24.5 metres to the gallery rail and 27.1 metres to the tip of the weather vane. It recorded one hundred and twelve \
steps, with a note that the lowest one had historically been left out of the count. It described the roof as \
sound, the windows as poor, and the lantern room as "intact, dusty, and better preserved than anyone had reason \
to expect." In the final paragraph, which his supervisor later said was not strictly necessary, he wrote that the \
building was looked after by a former keeper who knew more about it than any document did, and that any plan for \
its future should begin with a conversation with him.

The council met in June. After two hours of debate, they voted to lease the tower to a small charity for a token \
rent of one pound a year, on condition that it be opened to visitors on weekends during the summer. Mr Abernathy \
was appointed as the first volunteer guide. On opening day he stood at the bottom of the stairs with a clipboard, \
which he had borrowed from the allotment association, and asked every visitor to count the steps on the way up.

Most of them said one hundred and eleven.
"""

PROMPTS = [
    "What is the capital of France, and why did it become the capital?",
    "Write a short poem about a cat who is afraid of the rain.",
    "Once upon a time, in a village at the edge of a great forest,",
    "Explain in simple terms how a refrigerator keeps food cold.",
    "List three tips for someone learning to play the guitar:",
    "The detective looked at the broken window and said,",
    "How many legs does a spider have? Answer in one sentence.",
    "Translate the following sentence into French: The weather is nice today.",
    "My favourite thing about autumn is",
    "Here is a simple recipe for pancakes. First,",
]
