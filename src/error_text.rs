//! Libtorch's errors and caught panics as one line of
//! words, for every message this crate writes: the process groups
//! (`dist`), the autograd shim (`autograd`) and the checkpoints (`train`)
//! all turn C++ stacks and `unwrap` panics into the cause a person can act
//! on. Tested through their messages: `cargo test --test dist`,
//! `cargo test --test autograd`, `cargo test --test train`.

/// A panic message in one line of words. tch's panicking methods unwrap a
/// libtorch error, so the message is `called Result::unwrap() on an Err
/// value: Torch("...")` with libtorch's C++ stack escaped inside; keep the
/// cause, drop the rest.
pub fn panic_in_words(message: &str) -> String {
    match message.split_once("Torch(\"") {
        Some((_, inside)) => {
            let inside = inside.replace("\\n", "\n").replace("\\\"", "\"");
            format!("libtorch: {}", cause_in_words(inside.trim_end_matches("\")")))
        }
        None => message.lines().next().unwrap_or(message).to_string(),
    }
}

/// A caught panic's payload as one line of words (see [`panic_in_words`]).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let text = if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        return "(a panic without a message)".to_string();
    };
    // One line: libtorch's C++ stack inside a tch panic says nothing to a user.
    panic_in_words(&text)
}

/// A libtorch or safetensors error message as one line of words: libtorch
/// appends its C++ stack ("Exception raised from ... frame #0 ..."), tch
/// prefixes "Internal torch error: ", and safetensors names its error kinds
/// as code (`MetadataIncompleteBuffer`, `IoError(Os { .. })`).
pub fn cause_in_words(message: &str) -> String {
    let first = message.split("\nException raised from").next().unwrap_or(message);
    let first = first.split("\nframe #").next().unwrap_or(first);
    let first = first.lines().next().unwrap_or("").trim();
    let text = first.trim_start_matches("Internal torch error: ").trim();
    if let Some(start) = text.find("message: \"") {
        // An I/O error inside safetensors: keep its own words.
        let rest = &text[start + "message: \"".len()..];
        let words = rest.split('"').next().unwrap_or(rest);
        let prefix = text.split("IoError").next().unwrap_or("").trim_end_matches([' ', ':']);
        return format!("{prefix}: {}", words.to_lowercase()).trim_start_matches(": ").to_string();
    }
    const NOT_COMPLETE: [&str; 9] = [
        "MetadataIncompleteBuffer",
        "InvalidHeader",
        "HeaderTooLarge",
        "HeaderTooSmall",
        "InvalidHeaderLength",
        "ValidationOverflow",
        "InvalidOffset",
        "TensorInvalidInfo",
        "InvalidTensorView",
    ];
    if let Some(kind) = NOT_COMPLETE.iter().find(|kind| text.contains(*kind)) {
        let prefix = text.split(kind).next().unwrap_or("").trim_end_matches([' ', ':']);
        return format!(
            "{prefix}: not a complete safetensors file (cut short, or not written by this program)"
        )
        .trim_start_matches(": ")
        .to_string();
    }
    // libtorch's words for an operation on an undefined tensor name no
    // cause a learner would recognise; the usual one is a missing gradient.
    if text.contains("does not have a device") || text.contains("undefined Tensor") {
        return format!(
            "{text} (the tensor is undefined: a gradient that was never computed? check \
             `.defined()` before using it)"
        );
    }
    text.to_string()
}
