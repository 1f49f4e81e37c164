//! The closing chapter's decision guide as a command: the bytes of model
//! states (parameters, gradients, AdamW's state) one device holds under DDP,
//! ZeRO-1, ZeRO-2 and FSDP, for a model's parameter count on N devices of
//! a given memory, in float32 and in mixed precision, and the verdict: DDP
//! if it fits, else the least sharding that fits, else tensor or pipeline
//! parallelism. Arithmetic only (`ddp::plan_memory`): activations, gathered
//! units, buffers and fragmentation come on top, so what is left of the
//! device must hold them.
//!
//! With `--models`, the introduction's table instead: the model states of a
//! few well-known model sizes in float32, and whether they fit on one device.
//!
//! Run: cargo run --example plan -- --params 7e9 --devices 4 --device-gib 80
//!      cargo run --example plan -- --models --table chapters/tables/model-states.md
//!      cargo run --example plan -- --params 70e9 --devices 8 --device-gib 80 --precision mixed
//!      cargo run --example plan -- --params 7e9 --devices 4 --device-gib 80 --table chapters/tables/plan.md
//! (`--table` writes the tables with the machine, the date and the command,
//! support/table_file.rs, for the closing chapter to include.)

use clap::{Parser, ValueEnum};
use ddp_workbook::ddp::{plan_memory, Precision, ShardingStage, GIB};

#[path = "support/table_file.rs"]
mod table_file;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Precisions {
    Float32,
    Mixed,
    Both,
}

#[derive(Parser)]
#[command(about = "Memory per device for DDP, ZeRO-1, ZeRO-2 and FSDP, and which to use")]
#[command(allow_negative_numbers = true)]
struct Args {
    /// The model's parameter count (7e9 for a 7B model).
    #[arg(long, default_value_t = 7e9)]
    params: f64,
    /// How many devices train it.
    #[arg(long, default_value_t = 4)]
    devices: usize,
    /// One device's memory, in GiB.
    #[arg(long, default_value_t = 80.0)]
    device_gib: f64,
    /// float32 (4 + 4 + 8 bytes per parameter), mixed (2 + 2 + 12) or both.
    #[arg(long, value_enum, default_value_t = Precisions::Both)]
    precision: Precisions,
    /// Print the model states of well-known model sizes on one device of
    /// --device-gib instead (the introduction's table).
    #[arg(long)]
    models: bool,
    /// Also write the tables, the machine, the date and this command to this
    /// Markdown file (relative to the repository).
    #[arg(long)]
    table: Option<String>,
}

/// Well-known sizes, rounded: GPT-2's smallest and largest, and three of
/// the sizes Llama-style models come in.
const MODELS: [(&str, f64); 5] = [
    ("GPT-2 small", 124e6),
    ("GPT-2 XL", 1.5e9),
    ("Llama-style", 7e9),
    ("Llama-style", 13e9),
    ("Llama-style", 70e9),
];

/// The introduction's table: each model's float32 model states, term by
/// term, and whether DDP's whole copy fits on one device of `device_gib`.
fn models_table(device_gib: f64) -> anyhow::Result<String> {
    let gb = |bytes: f64| {
        let gb = bytes / 1e9;
        if gb < 10.0 {
            format!("{gb:.2} GB")
        } else {
            format!("{gb:.0} GB")
        }
    };
    let b = Precision::Float32.bytes_per_parameter();
    let mut out = format!(
        "| model | parameters | weights ({} B) | gradients ({} B) | Adam *m*, *v* ({} B) | total ({} B) | fits in {device_gib} GiB? |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | --- |\n",
        b.parameters,
        b.gradients,
        b.optimizer_state,
        b.total()
    );
    for (name, params) in MODELS {
        let plan = plan_memory(params, 1, device_gib * GIB, Precision::Float32)?;
        let whole = plan.row(ShardingStage::Ddp);
        let count = if params >= 1e9 { format!("{} B", params / 1e9) } else { format!("{} M", params / 1e6) };
        out += &format!(
            "| {name} | {count} | {} | {} | {} | {} | {} |\n",
            gb(params * b.parameters),
            gb(params * b.gradients),
            gb(params * b.optimizer_state),
            gb(whole.per_device_bytes()),
            if whole.fits() { "yes" } else { "no" }
        );
    }
    Ok(out)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let run = table_file::Run::start();
    if args.models {
        let body = models_table(args.device_gib)?;
        let settings = [format!(
            "float32 with AdamW, parameter counts rounded; GB = 10^9 bytes, {} GiB = {:.1} GB",
            args.device_gib,
            args.device_gib * GIB / 1e9
        )];
        print!("{body}");
        if let Some(path) = &args.table {
            let command = table_file::command_line("cargo run --example plan");
            let body = format!("{body}\n{}", run.caption(&settings, &command));
            println!("wrote {}", table_file::write_table(path, &command, &body)?.display());
        }
        return Ok(());
    }
    let precisions = match args.precision {
        Precisions::Float32 => vec![Precision::Float32],
        Precisions::Mixed => vec![Precision::Mixed],
        Precisions::Both => vec![Precision::Float32, Precision::Mixed],
    };
    let mut body = String::new();
    for precision in precisions {
        let plan = plan_memory(args.params, args.devices, args.device_gib * GIB, precision)?;
        let b = precision.bytes_per_parameter();
        body += &format!(
            "{}, unsharded {} + {} + {} = {} bytes per parameter:\n\n{}\nVerdict: {}.\n\n",
            capitalized(precision.describe()),
            b.parameters,
            b.gradients,
            b.optimizer_state,
            b.total(),
            plan.markdown(),
            plan.advice()
        );
    }
    let settings = [
        format!(
            "{} parameters on {} devices of {} GiB each; GB = 10^9 bytes",
            table_file::thousands(args.params),
            args.devices,
            args.device_gib
        ),
        "model states only: activations, the units FSDP holds gathered, communication buffers, \
         the shards' padding and the allocator's fragmentation come on top, out of what is left"
            .to_string(),
    ];
    print!("{body}");
    settings.iter().for_each(|s| println!("- {s}"));
    if let Some(path) = &args.table {
        let command = table_file::command_line("cargo run --example plan");
        let body = format!("{body}{}", run.caption(&settings, &command));
        println!("wrote {}", table_file::write_table(path, &command, &body)?.display());
    }
    Ok(())
}

/// "float32" -> "Float32".
fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or(String::new(), |first| first.to_uppercase().chain(chars).collect())
}
