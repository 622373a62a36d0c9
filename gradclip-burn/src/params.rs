//! A module's float parameters in visiting order, with their paths: what the
//! clipper binds, and the names its per-tensor norms carry.

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::Tensor;

/// One float parameter of a module.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ParamInfo {
    pub id: ParamId,
    /// The path in the module, dot-separated (`layers.0.weight`).
    pub path: String,
    pub rank: usize,
    pub elements: usize,
}

#[derive(Default)]
struct Collect {
    stack: Vec<String>,
    params: Vec<ParamInfo>,
}

impl ModuleVisitor for Collect {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.stack.push(name.to_owned());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.stack.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        // The param's own field name is the last entered module name.
        let path = self.stack.join(".");
        self.params.push(ParamInfo {
            id: param.id,
            path,
            rank: D,
            elements: param.shape().num_elements(),
        });
    }
}

/// The float parameters of `module`, in the order burn visits them.
pub(crate) fn collect<M: Module>(module: &M) -> Vec<ParamInfo> {
    let mut visitor = Collect::default();
    module.visit(&mut visitor);
    visitor.params
}
