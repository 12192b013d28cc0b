//! Prints whether a CUDA driver and device are usable; exits 0 when at least
//! one device is present, 1 otherwise. Used by `cargo xtask test-cuda`.

use cachalot_core::Backend;
use cachalot_cuda::{CudaBackend, device_count, driver_version};

fn main() {
    match device_count() {
        Ok(n) if n > 0 => {
            let version = driver_version().unwrap_or(0);
            println!("cuda: {n} device(s), driver {version}");
            for i in 0..n {
                match CudaBackend::new(i) {
                    Ok(b) => {
                        let mem = b.memory_info().map(|m| m.total).unwrap_or(0);
                        println!(
                            "  device {i}: {} ({} MiB), capture introspection: {}",
                            b.device_name(),
                            mem >> 20,
                            b.capture().is_some()
                        );
                    }
                    Err(e) => println!("  device {i}: {e}"),
                }
            }
        }
        Ok(_) => {
            println!("cuda: the driver reports no device");
            std::process::exit(1);
        }
        Err(e) => {
            println!("cuda: {e}");
            std::process::exit(1);
        }
    }
}
