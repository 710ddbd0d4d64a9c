//! The load generator as a stand-alone program, for trying it before `kelp s3 bench` exists:
//!
//! ```text
//! cargo run --release -p kelp-s3bench --example s3bench -- \
//!     --endpoint http://127.0.0.1:7480 --access-key AK --secret-key SK --size 64KiB -c 16 -d 30s put
//! ```

use clap::Parser;

/// S3 load generator (the same options as `kelp s3 bench`).
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: kelp_s3bench::BenchArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match kelp_s3bench::run(&cli.bench, std::io::stdout()).await {
        Ok(_) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("s3bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
