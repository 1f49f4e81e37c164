use ddp_workbook::dist::{spawn, ReduceOp};
use ddp_workbook::tch::Tensor;
#[test]
fn smoke() {
    let sums = spawn(3, |pg| {
        let mut t = Tensor::from(pg.rank() as f32 + 1.0);
        pg.all_reduce(&mut t, ReduceOp::Sum)?;
        Ok(t.double_value(&[]))
    }).unwrap();
    assert_eq!(sums, vec![6.0; 3]);
    let r = spawn(3, |pg| {
        if pg.rank() == 1 { panic!("boom"); }
        let mut t = Tensor::from(1.0f32);
        pg.all_reduce(&mut t, ReduceOp::Sum)?;
        Ok(())
    });
    println!("{}", r.unwrap_err());
    println!("cuda? {}", ddp_workbook::tch::Cuda::is_available());
}
