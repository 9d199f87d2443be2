// 2-D pooling over NCHW, one thread per output element.
// Bindings: 0 x: array<${XT}> (N, C, H, W), read; 1 out: array<${OT}> (N, C, OH, OW), read_write
// (f32, or f16 storage computed in f32).
// Grid: ceil(N*C*OH*OW / 256) workgroups of 256, spread over x and y (65,535 per dimension).
// ${KIND}: 0 max, 1 average, 2 Lp norm. Shapes are baked in; windows outside [0, H) x [0, W) are padding.
${PRELUDE}
@group(0) @binding(0) var<storage, read> x: array<${XT}>;
@group(0) @binding(1) var<storage, read_write> out: array<${OT}>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let gid = (wid.y * nwg.x + wid.x) * 256u + lid.x;
    if (gid >= ${TOTAL}u) { return; }
    let ow = i32(gid % ${OW}u);
    let oh = i32((gid / ${OW}u) % ${OH}u);
    let nc = gid / (${OW}u * ${OH}u);
    let base = nc * ${HW}u;
    let h0 = oh * ${SH} - ${PT};
    let w0 = ow * ${SW} - ${PL};
    var acc: f32 = ${INIT};
    var seen_nan = false;
    var count = 0;      // window positions on real elements
    var count_pad = 0;  // window positions inside the declared padding too
    for (var i = 0; i < ${KH}; i++) {
        let h = h0 + i * ${DH};
        for (var j = 0; j < ${KW}; j++) {
            let w = w0 + j * ${DW};
            if (h >= -${PT} && h < ${H} + ${PB} && w >= -${PL} && w < ${W} + ${PR}) { count_pad += 1; }
            if (h < 0 || h >= ${H} || w < 0 || w >= ${W}) { continue; }
            let v = f32(x[base + u32(h * ${W} + w)]);
            count += 1;
            if (${KIND} == 0) {
                seen_nan = seen_nan || is_nan(v);
                acc = max(acc, v);
            } else if (${KIND} == 1) {
                acc += v;
            } else {
                acc += pow(abs(v), ${P}.0);
            }
        }
    }
    var r = acc;
    if (${KIND} == 0) {
        r = select(acc, nan_f32(), seen_nan);
    } else if (${KIND} == 1) {
        r = acc / f32(select(count, count_pad, ${INCLUDE_PAD}));
    } else {
        r = pow(acc, 1.0 / ${P}.0);
    }
    out[gid] = ${OT}(r);
}
