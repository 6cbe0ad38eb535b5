//! The prompt sets of the `speculative` and `policy` benchmarks, fixed before any tuning.

/// Copy and light-edit prompts as people use them (fixed before any tuning): quote
/// a passage, copy a paragraph, a story or code, fix typos, rename a variable, reformat a list,
/// answer with a quotation from a given text.
pub const COPY_EDIT: [&str; 12] = [
    "Repeat the following passage exactly, word for word.\n\nThe quality of mercy is not strain'd,\nIt droppeth as the gentle rain from heaven\nUpon the place beneath: it is twice blest;\nIt blesseth him that gives and him that takes:\n'Tis mightiest in the mightiest: it becomes\nThe throned monarch better than his crown;\nHis sceptre shows the force of temporal power,\nThe attribute to awe and majesty,\nWherein doth sit the dread and fear of kings;\nBut mercy is above this sceptred sway;\nIt is enthroned in the hearts of kings,\nIt is an attribute to God himself;\nAnd earthly power doth then show likest God's\nWhen mercy seasons justice.",
    "Copy the following paragraph exactly, then stop.\n\nThe committee met on Tuesday to review the budget for the coming year. After a long discussion, the members agreed to increase funding for the public library, to repair the roads in the northern district, and to hire two new teachers for the primary school. The mayor thanked everyone for their patience and closed the meeting at nine o'clock.",
    "Here is a short story. Copy it word for word.\n\nOnce upon a time, in a small village by the sea, there lived a fisherman named Tom. Every morning he sailed out before sunrise and came back at noon with a basket full of fish. One day he caught a golden fish that could speak. The fish begged to be set free, and Tom let it go.",
    "Repeat this function exactly:\n\ndef fibonacci(n):\n    if n < 2:\n        return n\n    a, b = 0, 1\n    for _ in range(n - 1):\n        a, b = b, a + b\n    return b\n\ndef factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result",
    "Correct the spelling in this text and otherwise keep it the same: The quik brown fox jumpd over the lazy dog. The dog was not amused and barkd at the fox, who ran away into the forrest. Later that day, the fox came back with his freinds to play in the feild.",
    "Fix the typo in this paragraph and return the whole paragraph unchanged otherwise:\n\nOur office will be closed on Monday for the public holiday. All orders placed over the weekend will be shipped on Tuesday morning. If you need help before then, please send an email to our support team and we will reply as soon as possibel. Thank you for your understanding.",
    "Rename the variable `tmp` to `total` in this code and change nothing else:\n\ndef sum_prices(items):\n    tmp = 0\n    for item in items:\n        tmp += item.price * item.quantity\n    if tmp > 100:\n        tmp = tmp * 0.9\n    return tmp",
    "Rewrite this list with every item on its own line, keeping the words unchanged: apples, oranges, bananas, grapes, pears, plums, cherries, lemons, limes, peaches, apricots, mangoes, melons, kiwis, figs.",
    "Turn this comma-separated list into a numbered list, one item per line: Monday morning team meeting, review the quarterly report, call the supplier about the late delivery, update the website, prepare the slides for Thursday, book the flights for the conference.",
    "Read the text and answer with an exact quotation from it.\n\nText: The lighthouse stood at the end of the rocky point for more than a hundred years. Its keeper, an old man named Elias, climbed the spiral stairs every evening to light the lamp. He said that the sea had taught him patience, and that the light was a promise to every sailor who passed in the dark.\n\nQuestion: What did Elias say the light was?",
    "Copy this recipe exactly as it is written:\n\nPancakes\n- 1 cup of flour\n- 1 tablespoon of sugar\n- 2 teaspoons of baking powder\n- a pinch of salt\n- 1 cup of milk\n- 1 egg\n- 2 tablespoons of melted butter\n\nMix the dry ingredients in a bowl. Whisk the milk, egg and butter, then stir them into the flour until just combined. Cook on a hot pan until bubbles form, then flip.",
    "Quote the second sentence of this text exactly: The river begins high in the mountains, where snow melts in the spring. It flows through forests and farmland for three hundred miles before it reaches the sea. Along the way it passes seven towns and two large cities.",
];

pub const SHAKESPEARE: [&str; 5] = [
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n",
    "Friends, Romans, countrymen, lend me your ears;\nI come to bury Caesar, not to praise him.\n",
    "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n",
    "All the world's a stage,\nAnd all the men and women merely players;\n",
    "O Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name;\n",
];

pub const OPEN: [&str; 5] = [
    "What are three good habits for staying healthy?",
    "Explain how a bicycle works to a child.",
    "Give me some ideas for a birthday party.",
    "Why is the sky blue?",
    "Write a short poem about autumn leaves.",
];

/// Retrieval-style questions over a passage of about 700 tokens: the answer draws on a long
/// context the drafters can copy from, but is mostly not a copy of it, so drafts are short
/// and often wrong. Each is asked about its own stretch of Tiny Shakespeare.
pub const PASSAGE_QUESTIONS: [&str; 5] = [
    "Who speaks in this passage, and what does each of them want?",
    "Summarize this passage in a few sentences.",
    "What is the mood of this passage? Explain briefly.",
    "Which names and places are mentioned in this passage?",
    "What happens in this passage, in plain modern English?",
];

/// Where the passages of [`PASSAGE_QUESTIONS`] start in Tiny Shakespeare (bytes; each runs
/// from the next speech on for [`PASSAGE_BYTES`], cut at a line's end).
const PASSAGE_STARTS: [usize; 5] = [40_000, 250_000, 480_000, 700_000, 930_000];

/// About 700 tokens of SmolLM2's or Qwen's tokenizer.
const PASSAGE_BYTES: usize = 2_600;

/// A prompt set as the benchmarks run it.
pub struct Set {
    pub name: &'static str,
    pub prompts: Vec<String>,
    /// Whether each prompt goes through the model's chat template.
    pub chat: bool,
    /// New tokens at most.
    pub max_tokens: usize,
}

/// The sets, in order: copy / light edit, Shakespeare continuation, open questions, and
/// questions over a passage (128 new tokens).
pub fn sets() -> Vec<Set> {
    let fixed = |name, prompts: &[&str], chat| Set {
        name,
        prompts: prompts.iter().map(|p| p.to_string()).collect(),
        chat,
        max_tokens: 256,
    };
    vec![
        fixed("copy / light edit", &COPY_EDIT, true),
        fixed("Shakespeare continuation", &SHAKESPEARE, false),
        fixed("open questions", &OPEN, true),
        Set {
            name: "questions over a passage",
            prompts: passage_questions(),
            chat: true,
            max_tokens: 128,
        },
    ]
}

/// The [`PASSAGE_QUESTIONS`], each after its passage.
fn passage_questions() -> Vec<String> {
    let text = infgram::assets::tiny_shakespeare().expect("the built-in Tiny Shakespeare");
    PASSAGE_STARTS
        .iter()
        .zip(PASSAGE_QUESTIONS)
        .map(|(&at, question)| {
            // From the first speech after `at` (a blank line) to the last line's end.
            let from = at + text[at..].find("\n\n").expect("a speech") + 2;
            let to = from
                + text[from..from + PASSAGE_BYTES]
                    .rfind('\n')
                    .expect("a line");
            format!(
                "Here is a passage from a play.\n\n{}\n\n{question}",
                &text[from..to]
            )
        })
        .collect()
}
