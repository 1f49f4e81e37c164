//! The autograd shim (src/autograd/): gradient-ready hooks and installed
//! gradients, on libtorch's real backward pass.
//!
//! Run: cargo test --test autograd

use std::sync::{Arc, Mutex};

use approx::{abs_diff_eq, relative_eq};
use ddp_workbook::autograd::{set_grad, AutogradError, GradReadyHooks};
use ddp_workbook::models::{named_parameters, Mlp};
use ddp_workbook::tch::nn::Module;
use ddp_workbook::tch::{Device, Kind, Tensor};

fn mlp() -> (ddp_workbook::tch::nn::VarStore, Mlp) {
    Mlp::seeded(7, &[3, 5, 4, 1], Kind::Double)
}

fn input() -> Tensor {
    Tensor::arange(12, (Kind::Double, Device::Cpu)).reshape([4, 3]) / 10.0
}

/// Every hook call: the index, and the sum of that gradient at that moment.
type Calls = Arc<Mutex<Vec<(usize, f64)>>>;

fn record(params: &[Tensor]) -> (GradReadyHooks, Calls) {
    let calls: Calls = Arc::default();
    // Tensors are Send but not Sync: the hook shares them behind a mutex.
    let watched = Mutex::new(params.iter().map(Tensor::shallow_clone).collect::<Vec<_>>());
    let seen = calls.clone();
    let hooks = GradReadyHooks::register(params, move |i| {
        let sum = watched.lock().unwrap()[i].grad().sum(Kind::Double).double_value(&[]);
        seen.lock().unwrap().push((i, sum));
    })
    .expect("the hooks register");
    (hooks, calls)
}

#[test]
fn each_hook_fires_once_per_backward_with_the_final_gradient_in_reverse_order() {
    let (vs, model) = mlp();
    let params: Vec<Tensor> = named_parameters(&vs).into_iter().map(|(_, p)| p).collect();
    let (_hooks, calls) = record(&params);
    model.forward(&input()).sum(None).backward();
    let calls = calls.lock().unwrap().clone();
    let order: Vec<usize> = calls.iter().map(|(i, _)| *i).collect();
    // Parameters in registration order are the layers front to back; backward runs back to front.
    let mut layers: Vec<usize> = (0..params.len()).collect();
    layers.reverse();
    let by_layer = |o: &[usize]| o.iter().map(|i| i / 2).collect::<Vec<_>>();
    assert_eq!(by_layer(&order), by_layer(&layers), "hook order {order:?}");
    for (i, sum) in calls {
        let final_sum = params[i].grad().sum(Kind::Double).double_value(&[]);
        assert_eq!(sum, final_sum, "parameter {i}: the hook saw a gradient that changed afterwards");
    }
}

#[test]
fn a_second_backward_fires_again_after_accumulating() {
    let (vs, model) = mlp();
    let params: Vec<Tensor> = named_parameters(&vs).into_iter().map(|(_, p)| p).collect();
    let (_hooks, calls) = record(&params);
    model.forward(&input()).sum(None).backward();
    let first: Vec<(usize, f64)> = calls.lock().unwrap().drain(..).collect();
    model.forward(&input()).sum(None).backward();
    let second: Vec<(usize, f64)> = calls.lock().unwrap().clone();
    assert_eq!(second.len(), params.len(), "one call per parameter per backward");
    for ((i, a), (j, b)) in first.iter().zip(&second) {
        assert_eq!(i, j);
        assert!(
            relative_eq!(*b, 2.0 * a, epsilon = 1e-12, max_relative = 1e-12),
            "parameter {i}: {b} is not twice {a}"
        );
    }
}

#[test]
fn dropping_the_guard_removes_every_hook() {
    let (vs, model) = mlp();
    let params: Vec<Tensor> = named_parameters(&vs).into_iter().map(|(_, p)| p).collect();
    let (hooks, calls) = record(&params);
    drop(hooks);
    model.forward(&input()).sum(None).backward();
    assert!(calls.lock().unwrap().is_empty(), "a removed hook ran");
}

#[test]
fn a_panicking_callback_is_caught_and_reported() {
    let w = Tensor::ones([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let hooks = GradReadyHooks::register(&[w.shallow_clone()], |_| panic!("deliberate")).unwrap();
    (&w * 2.0).sum(None).backward(); // must not unwind through libtorch
    assert_eq!(hooks.take_panic().as_deref(), Some("deliberate"));
    assert_eq!(hooks.take_panic(), None, "taken once");
    assert_eq!(Vec::<f32>::try_from(w.grad()).unwrap(), vec![2.0; 3], "backward still finished");
}

#[test]
fn hooks_refuse_tensors_that_get_no_gradient() {
    let plain = Tensor::ones([2], (Kind::Float, Device::Cpu));
    let error = GradReadyHooks::register(&[plain], |_| {}).err().expect("refused");
    assert!(
        matches!(error, AutogradError::Invalid(_)) && error.to_string().contains("parameter 0"),
        "{error}"
    );
}

#[test]
fn an_installed_gradient_is_where_backward_accumulates_and_zero_grad_zeroes() {
    let (vs, model) = mlp();
    let params = named_parameters(&vs);
    let total: i64 = params.iter().map(|(_, p)| p.numel() as i64).sum();
    let flat = Tensor::zeros([total], (Kind::Double, Device::Cpu));
    let mut offset = 0;
    for (_, p) in &params {
        let n = p.numel() as i64;
        set_grad(p, &flat.narrow(0, offset, n).view(p.size().as_slice())).unwrap();
        offset += n;
    }
    model.forward(&input()).sum(None).backward();
    let from_params: f64 = params.iter().map(|(_, p)| p.grad().sum(Kind::Double).double_value(&[])).sum();
    let in_flat = flat.sum(Kind::Double).double_value(&[]);
    assert!(
        in_flat != 0.0 && abs_diff_eq!(in_flat, from_params, epsilon = 1e-12),
        "flat {in_flat} vs gradients {from_params}"
    );
    assert_eq!(params[0].1.grad().data_ptr(), flat.data_ptr(), "the first gradient is the buffer's start");
    // tch's `Optimizer::zero_grad` detaches each gradient in place, which
    // libtorch refuses for a view: zero the gradients themselves instead.
    for (_, p) in &params {
        let _ = p.grad().zero_();
    }
    assert_eq!(
        flat.abs().sum(Kind::Double).double_value(&[]),
        0.0,
        "zeroing the gradients zeroed the buffer"
    );
    assert_eq!(params[0].1.grad().data_ptr(), flat.data_ptr(), "and the gradient is still the buffer");
}

#[test]
fn set_grad_refuses_a_gradient_of_another_shape_or_dtype() {
    let p = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    for bad in [
        Tensor::zeros([3, 2], (Kind::Float, Device::Cpu)),
        Tensor::zeros([2, 3], (Kind::Double, Device::Cpu)),
    ] {
        let error = set_grad(&p, &bad).unwrap_err();
        assert!(error.to_string().contains("cannot belong to a Float[2, 3] parameter"), "{error}");
    }
}

#[test]
fn two_guards_on_one_parameter_both_fire_and_dropping_either_keeps_the_other() {
    let (vs, model) = mlp();
    let params: Vec<Tensor> = named_parameters(&vs).into_iter().map(|(_, p)| p).collect();
    let (first, first_calls) = record(&params);
    let (second, second_calls) = record(&params);
    model.forward(&input()).sum(None).backward();
    assert_eq!(first_calls.lock().unwrap().len(), params.len(), "the first guard's hooks fired");
    assert_eq!(second_calls.lock().unwrap().len(), params.len(), "the second guard's hooks fired");
    drop(first); // must remove its own hooks only
    model.forward(&input()).sum(None).backward();
    assert_eq!(first_calls.lock().unwrap().len(), params.len(), "a dropped guard's hook ran");
    assert_eq!(
        second_calls.lock().unwrap().len(),
        2 * params.len(),
        "dropping the first guard removed the second guard's hooks"
    );
    drop(second);
    model.forward(&input()).sum(None).backward();
    assert_eq!(second_calls.lock().unwrap().len(), 2 * params.len(), "no hook is left after both drop");
}

#[test]
fn dropping_the_guard_while_backward_runs_on_another_thread_waits_for_the_running_hook() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};
    // The first hook to fire says so and takes its time; meanwhile this
    // thread drops the guard. The drop must wait for that callback (its
    // context is freed right after), and no hook may run once it returned.
    let (vs, model) = mlp();
    let params: Vec<Tensor> = named_parameters(&vs).into_iter().map(|(_, p)| p).collect();
    let (inside, hook_is_running) = std::sync::mpsc::channel::<()>();
    let (calls, finished) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(None::<Instant>)));
    let (counted, finishing, inside) = (calls.clone(), finished.clone(), Mutex::new(inside));
    let hooks = GradReadyHooks::register(&params, move |_| {
        if counted.fetch_add(1, Ordering::SeqCst) == 0 {
            inside.lock().unwrap().send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            *finishing.lock().unwrap() = Some(Instant::now());
        }
    })
    .expect("the hooks register");
    let backward = std::thread::spawn(move || model.forward(&input()).sum(None).backward());
    hook_is_running.recv().expect("a hook fires on the backward thread");
    drop(hooks);
    let dropped = Instant::now();
    let calls_when_dropped = calls.load(Ordering::SeqCst);
    backward.join().expect("backward ends");
    let finished = finished.lock().unwrap().expect("the running callback finished");
    assert!(
        dropped >= finished,
        "the guard's drop returned {:?} before the callback running on the backward thread had \
         finished, and freed what that callback uses",
        finished - dropped
    );
    assert_eq!(calls.load(Ordering::SeqCst), calls_when_dropped, "a hook ran after the guard was dropped");
}

#[test]
fn a_storage_resized_to_0_is_freed_and_autograd_reads_it_refilled() {
    // FSDP frees a parameter after forward while the graph holds it, and
    // fills the same storage again before backward.
    use ddp_workbook::autograd::{resize_storage, storage_bytes};
    let w = Tensor::from_slice(&[1.0f64, 2.0, 3.0]).set_requires_grad(true);
    let x = Tensor::from_slice(&[0.5f64, 0.25, 0.125]).set_requires_grad(true);
    let y = (&x * &w).sum(None); // saves w for x's gradient
    resize_storage(&w, 0).unwrap();
    assert_eq!(storage_bytes(&w), 0, "resizing to 0 must free the storage");
    resize_storage(&w, 3 * 8).unwrap();
    assert_eq!(storage_bytes(&w), 24);
    let values = Tensor::from_slice(&[4.0f64, 5.0, 6.0]);
    ddp_workbook::tch::no_grad(|| w.data().copy_(&values)); // `data()`: no version bump
    y.backward();
    assert!(x.grad().equal(&values), "backward must read the refilled storage: {:?}", x.grad());
}

#[test]
fn a_tensor_hook_runs_before_the_gradient_reaches_the_parameters() {
    use ddp_workbook::autograd::register_grad_hook;
    let w = Tensor::from_slice(&[1.0f64, 2.0]).set_requires_grad(true);
    let order = Arc::new(Mutex::new(vec![]));
    let h = &w * 3.0;
    let seen = order.clone();
    register_grad_hook(&h, move || seen.lock().unwrap().push("h")).unwrap();
    let seen = order.clone();
    let _hooks =
        GradReadyHooks::register(&[w.shallow_clone()], move |_| seen.lock().unwrap().push("w")).unwrap();
    h.sum(None).backward();
    assert_eq!(
        *order.lock().unwrap(),
        ["h", "w"],
        "the hook on h must run before w's gradient is accumulated"
    );
    let refused = register_grad_hook(&Tensor::from_slice(&[1.0f64]), || {});
    assert!(
        matches!(refused, Err(AutogradError::Invalid(_))),
        "a tensor without grad has no gradient to hook"
    );
}
