//! A tiny GPT-style transformer (placeholder: being written).
#[derive(Debug, Clone)]
pub struct GptConfig;
#[derive(Debug)]
pub struct Gpt;
