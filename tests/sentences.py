"""Varied test sentences: English (numbers, abbreviations, questions, exclamations, long
ones), and for each of Piper's other phoneme types sentences of its language with numbers,
punctuation and mixed scripts."""

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

# Chinese: polyphones (重庆 chong2, 银行 hang2, 行走 xing2, 长江 chang2, 长大 zhang3, 音乐
# yue4, 快乐 le4), temperatures, percentages, decimals, quotes, Latin, several sentences.
ZH_SENTENCES = [
    "我们去重庆的银行，然后沿着长江行走。",
    "今天气温-7°C，明天12℃，湿度77%，降雨概率百分之三十。",
    "价格是3.5元，一共1024件，打八折。",
    "他说：“你好”！你明天会来吗？",
    "我用iPhone给妈妈打电话，她说OK。",
    "音乐让人快乐；孩子长大以后还要学习。",
    "第一句话。第二句话！第三句话？",
]

JA_SENTENCES = [
    "今日は良い天気ですね。",
    "東京タワーの高さは333メートルです。",
    "明日、雨が降りますか？",
    "iPhoneで写真を撮った。それから、家に帰りました！",
]

HE_SENTENCES = [
    "שלום עולם, מה שלומך?",
    "יש לי 3 ספרים על השולחן.",
    "הטמפרטורה היום היא 25 מעלות!",
    "אני משתמש ב-iPhone כל יום.",
]

TH_SENTENCES = [
    "สวัสดีครับ วันนี้อากาศดี",
    "ราคา 1,250 บาท ลดราคา 15%",
    "ข่าว ข้าว ปลา ป่า ป้า",
    "เด็กๆ ไปโรงเรียน. ฉันชอบ iPhone มาก!",
]

AR_SENTENCES = [
    "مرحبا بكم في المنزل.",
    "الساعة الآن 3 مساءً، والجو جميل.",
]

TEXT_SENTENCES = [
    "Hello, world!",
    "Crème brûlée costs 5 euros.",
]
