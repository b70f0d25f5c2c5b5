"""Varied English test sentences: numbers, abbreviations, questions, exclamations, long ones."""

SENTENCES = [
    "Turn on the kitchen lights.",
    "Hello from herald.",
    "Is the front door locked?",
    "Wow, that was fast!",
    "Dr. Smith paid $42.50 for 3 apples on Jan. 5th, 2024.",
    "The meeting starts at 10:30 a.m. in room 221B.",
    "Set the thermostat to 21.5 degrees Celsius.",
    "NASA, the FBI and the UN met in Washington, D.C. yesterday.",
    "Warning: the garage door has been open for 15 minutes!",
    "Did you remember to water the plants, feed the cat, and take out the recycling?",
    "It's 7 degrees outside; wear a warm coat.",
    "Your package, order number 12345, will arrive between 2 and 4 p.m.",
    "Mr. and Mrs. O'Brien arrived at 6 o'clock sharp.",
    "The battery level of the smoke detector is at 9 percent.",
    "Really? I didn't expect that at all!",
    "Version 3.2.1 fixes 27 bugs and adds 4 new features.",
    "Good morning! Today is Monday, the 1st of December.",
    "Please call 555-0199 if the alarm sounds again.",
    "The quick brown fox jumps over the lazy dog.",
    "Rain is expected from 3 to 6 p.m., with winds up to 40 km/h.",
    "Welcome home; the living room is 22 degrees and the humidity is 45%.",
    ("When you leave the house tomorrow morning, please remember to close every window, "
     "switch off the heating in the guest room, lock the back door twice, and tell the "
     "neighbours that we will be away for about three weeks."),
]

LONG_SENTENCE = (
    "The weather service says that a band of heavy rain will reach the coast this evening, "
    "bringing strong winds, falling temperatures and the chance of thunder before it clears "
    "out early tomorrow morning."
)
