/* forensics report: draws the page from the JSON in #fx-data (inlined by
 * forensics/output/html.py).  Plain DOM and SVG, no libraries, no network.
 *
 * Every string from the core reaches the DOM through textContent or
 * setAttribute, never as markup.  Errors (thrown here or reported by the
 * browser) are listed in #fx-status, whose data-errors attribute counts them,
 * so a headless browser's DOM dump shows whether the page ran cleanly.
 *
 * URL hash (applied once the page is drawn): #select=N, #sort=KEY,
 * #filter=TEXT, #scroll=ID - see applyHash.
 */
(function () {
  'use strict';

  var t0 = window.performance ? performance.now() : 0;
  var SVGNS = 'http://www.w3.org/2000/svg';
  var status = document.getElementById('fx-status');
  var errorList = document.getElementById('fx-errors');
  var nerrors = 0;

  function recordError(msg) {
    nerrors += 1;
    status.setAttribute('data-errors', String(nerrors));
    var li = document.createElement('li');
    li.textContent = String(msg);
    errorList.appendChild(li);
  }
  window.addEventListener('error', function (e) {
    recordError((e.message || 'error') + ' at ' + (e.filename || '?') + ':' + (e.lineno || 0));
  });
  window.addEventListener('unhandledrejection', function (e) {
    recordError('unhandled rejection: ' + (e.reason && e.reason.message || e.reason));
  });
  var consoleError = console.error;
  console.error = function () {
    recordError(Array.prototype.join.call(arguments, ' '));
    return consoleError.apply(console, arguments);
  };

  // ----------------------------------------------------------- helpers --

  /* el('div', {class: 'x', 'data-n': 3}, [child, 'text', ...]) */
  function el(tag, attrs, children, ns) {
    var node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    if (attrs) {
      for (var k in attrs) {
        if (Object.prototype.hasOwnProperty.call(attrs, k) && attrs[k] !== null && attrs[k] !== undefined) {
          // style through the CSSOM: the page's CSP refuses style attributes
          if (k === 'style') node.style.cssText = String(attrs[k]);
          else node.setAttribute(k, String(attrs[k]));
        }
      }
    }
    if (children !== undefined && children !== null) {
      if (!Array.isArray(children)) children = [children];
      children.forEach(function (c) {
        if (c === null || c === undefined) return;
        node.appendChild(typeof c === 'object' ? c : document.createTextNode(String(c)));
      });
    }
    return node;
  }
  function svg(tag, attrs, children) { return el(tag, attrs, children, SVGNS); }
  var PROC_COLORS = ['#2456c7', '#1b8a5a', '#8e44ad', '#c0392b', '#7f8c8d', '#d35400'];
  function procColor(i) { return PROC_COLORS[i % PROC_COLORS.length]; }

  function fmtBytes(n) {
    var units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    var i = 0;
    var v = Number(n);
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return (i === 0 ? String(v) : v.toFixed(v >= 100 ? 0 : v >= 10 ? 1 : 2)) + ' ' + units[i];
  }
  function fmtInt(n) { return Number(n).toLocaleString('en-US'); }
  function fmtTime(t) {
    if (t === null || t === undefined) return 'time unknown';
    var d = new Date(t * 1000);
    return d.toISOString().replace('T', ' ').replace('Z', ' UTC');
  }
  function basename(p) { return p ? String(p).replace(/^.*\//, '') : ''; }

  var data = JSON.parse(document.getElementById('fx-data').textContent);
  var frames = data.frames;
  /* Cores of a process that never ran libtag: glibc's heap, no stacks - the
   * heap by chunk size in place of the hierarchy and the stack table. */
  var PLAIN = data.libtag === false;
  var select = null;  // the hierarchy's: select(node) zooms in and shows its stack

  function frameName(i) {
    var f = frames[i];
    if (!f) return '??';
    return f.label || f.function || f.address;
  }
  function frameWhere(i) {
    var f = frames[i];
    if (!f) return '';
    if (f.file) return f.file + (f.line ? ':' + f.line : '');
    if (f.module) return f.module;
    return '';
  }
  /* An <ol> of frames, innermost first. */
  function frameList(ids) {
    if (!ids.length) return el('p', {class: 'note'}, '(no stack recorded)');
    return el('ol', {class: 'frames'}, ids.map(function (i) {
      return el('li', {'data-function': frames[i] && frames[i].function || ''}, [
        el('span', {class: 'fn'}, frameName(i)),
        el('span', {class: 'addr'}, frames[i] ? ' ' + frames[i].address : ''),
        frameWhere(i) ? el('span', {class: 'where'}, ' at ' + frameWhere(i)) : null
      ]);
    }));
  }
  /* A stack's first live blocks by address, for `forensics whoowns ADDR`. */
  function blockDetails(r) {
    if (!r.blockList.length) return null;
    var shown = r.blockList.length < r.blocks ? 'first ' + r.blockList.length + ' of ' + fmtInt(r.blocks) + ' blocks'
                                              : fmtInt(r.blocks) + (r.blocks === 1 ? ' block' : ' blocks');
    return el('details', {class: 'blocks'}, [
      el('summary', null, shown),
      el('ul', {class: 'blocks'}, r.blockList.map(function (b) {
        return el('li', {'data-start': b.start}, [
          el('span', {class: 'addr'}, b.start),
          ' ' + fmtInt(b.size) + ' bytes, thread ' + b.thread +
          (b.age_ms !== null ? ', ' + (b.age_ms / 1000).toFixed(3) + ' s old' : '')]);
      })),
      el('p', {class: 'note'}, 'forensics whoowns ADDR --core CORE: who holds a block and who points at it')]);
  }
  /* "allocated at": the first frame outside the allocation wrappers. */
  function siteText(ids, site) {
    if (!ids.length) return '(no stack recorded)';
    var f = ids[site || 0];
    var where = frames[f] && frames[f].file ? basename(frames[f].file) + (frames[f].line ? ':' + frames[f].line : '') : '';
    return frameName(f) + (where ? ' (' + where + ')' : '');
  }
  function siteSummary(ids, site) {
    return el('summary', {'data-site': ids.length ? frames[ids[site || 0]].function || '' : ''},
              siteText(ids, site));
  }
  function section(title, id, sub) {
    var s = el('section', {id: id}, [el('h2', null, title)]);
    if (sub) s.appendChild(el('p', {class: 'sub'}, sub));
    app.appendChild(s);
    return s;
  }

  var app = document.getElementById('fx-app');
  app.textContent = '';
  var snaps = data.snapshots;
  var primary = snaps[data.primary];

  // ------------------------------------------------------------ header --

  var procs = data.processes;
  app.appendChild(el('h1', null, data.title));
  if (procs.length > 1) {
    /* Cores of several processes: their heaps are not one curve, and their
     * blocks and stacks are not comparable. */
    app.appendChild(el('div', {class: 'banner warn', id: 'fx-processes', 'data-count': procs.length}, [
      el('strong', null, 'These cores come from ' + procs.length + ' different processes. '),
      'Each has its own curve below; ' + (PLAIN ? 'the sizes and the leaks are' : 'the hierarchy, the leaks and the table are') +
        ' of the newest core only (pid ' +
        primary.pid + ').',
      el('ul', null, procs.map(function (p, i) {
        return el('li', {'data-pid': p.pid}, [
          el('i', {class: 'swatch', style: 'background:' + procColor(i), 'data-process': i}),
          'pid ' + p.pid + ' ', el('code', null, p.exe || '?'),
          ': ' + p.cores + ' core' + (p.cores === 1 ? '' : 's')]);
      }))
    ]));
  }
  if (PLAIN) {
    var wl = data.without_libtag;
    app.appendChild(el('div', {class: 'banner warn', id: 'fx-without-libtag'}, [
      el('strong', null, 'Without libtag. '),
      'These cores are of a process that never ran libtag: this page is read from glibc\'s own heap ' +
        '(its arenas and chunks). Unknown without libtag: ' + wl.unknown.join(', ') +
        ' - so no allocation hierarchy and no table of stacks; the chunks in use by size instead. ' +
        wl.hint.charAt(0).toUpperCase() + wl.hint.slice(1) + '.']));
  }
  app.appendChild(el('p', {class: 'sub'}, [
    snaps.length + ' snapshot' + (snaps.length === 1 ? '' : 's') + (PLAIN ? '; sizes and leaks of ' : '; hierarchy and table of '),
    el('code', null, primary.core),
    ' (pid ' + primary.pid + ', ' + primary.reason + ', ' + fmtTime(primary.time) + '): ' +
      fmtBytes(primary.live_bytes) + ' live in ' + fmtInt(primary.live_blocks) + ' blocks. Generated ' +
      data.generated + '.'
  ]));

  // ------------------------------------------------------------- curve --

  /* Put labels (SVG text already in the document, each with its wanted
   * centre x) in rows so that no two overlap: each goes into the first row
   * whose last label ends left of it; a label that fits in no row is hidden
   * (its point's tooltip still says it).  Returns the rows used. */
  function placeLabels(labels, maxRows) {
    var GAP = 6;
    var ends = [];
    labels.forEach(function (lb) { lb.w = lb.node.getBBox().width; });
    labels.sort(function (a, b) { return a.x - b.x; });
    labels.forEach(function (lb) {
      var left = lb.x - lb.w / 2;
      lb.row = -1;
      for (var r = 0; r < maxRows; r++) {
        if (ends[r] === undefined || left >= ends[r] + GAP) {
          lb.row = r;
          ends[r] = left + lb.w;
          break;
        }
      }
      if (lb.row < 0) {
        lb.node.setAttribute('display', 'none');
        lb.node.setAttribute('data-hidden', '1');
      }
    });
    return Math.max(1, ends.length);
  }
  /* Each shown label's box as the browser lays it out, for the record. */
  function recordBoxes(labels) {
    labels.forEach(function (lb) {
      if (lb.row < 0) return;
      var b = lb.node.getBBox();
      lb.node.setAttribute('data-bbox', [b.x, b.y, b.width, b.height].map(function (v) {
        return v.toFixed(1); }).join(' '));
    });
  }

  function drawCurve(host) {
    var W = 1200, L = 80, R = 80, PLOT = 200, ROWH = 15;
    var n = snaps.length;
    var times = snaps.map(function (s) { return s.time === null ? null : s.time; });
    var useTime = times.every(function (t) { return t !== null; });
    var xs = useTime ? times : snaps.map(function (s, i) { return i; });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var maxBytes = Math.max(1, Math.max.apply(null, snaps.map(function (s) { return s.live_bytes; })));
    var maxBlocks = Math.max(1, Math.max.apply(null, snaps.map(function (s) { return s.live_blocks; })));
    function X(v) { return x1 === x0 ? L + (W - L - R) / 2 : L + (v - x0) / (x1 - x0) * (W - L - R); }
    var root = svg('svg', {class: 'chart', id: 'fx-curve', viewBox: '0 0 ' + W + ' 400',
                           role: 'img', 'aria-label': 'live heap over the snapshots',
                           'data-points': n, 'data-processes': procs.length});
    host.appendChild(root);  // in the document first: labels are measured
    /* Enough decimals to tell the two closest snapshots apart (ms at most). */
    var sorted = xs.slice().sort(function (a, b) { return a - b; });
    var gap = Infinity;
    for (var k = 1; k < sorted.length; k++) if (sorted[k] > sorted[k - 1]) gap = Math.min(gap, sorted[k] - sorted[k - 1]);
    var decimals = gap === Infinity ? 0 : Math.max(0, Math.min(3, Math.ceil(-Math.log10(gap))));
    function timeText(v) {
      if (!useTime) return '#' + (v + 1);
      return '+' + (v - x0).toFixed(decimals) + ' s';
    }
    var reasonLabels = [], timeLabels = [];
    snaps.forEach(function (s, i) {
      var cx = X(xs[i]);
      var r = svg('text', {class: 'fx-label reason' + (s.reason === 'on-demand' || s.reason === 'exit' ? '' : ' bad'),
                           x: cx, y: 0, 'text-anchor': 'middle', 'data-reason': s.reason, 'data-point': i},
                  s.reason);
      var t = svg('text', {class: 'fx-label time', x: cx, y: 0, 'text-anchor': 'middle', 'data-point': i},
                  timeText(xs[i]));
      root.appendChild(r);
      root.appendChild(t);
      reasonLabels.push({node: r, x: cx});
      timeLabels.push({node: t, x: cx});
    });
    var topRows = placeLabels(reasonLabels, 4), bottomRows = placeLabels(timeLabels, 3);
    var T = 26 + topRows * ROWH, B = 10 + bottomRows * ROWH + 6;
    var H = T + PLOT + B;
    root.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    reasonLabels.forEach(function (lb) { lb.node.setAttribute('y', T - 10 - (topRows - 1 - lb.row) * ROWH); });
    timeLabels.forEach(function (lb) { lb.node.setAttribute('y', T + PLOT + 16 + lb.row * ROWH); });
    function Yb(v) { return T + PLOT - v / (maxBytes * 1.1) * PLOT; }
    function Yn(v) { return T + PLOT - v / (maxBlocks * 1.1) * PLOT; }
    var under = svg('g', {class: 'under'});
    root.insertBefore(under, root.firstChild);
    for (var g = 0; g <= 4; g++) {
      var yv = maxBytes * 1.1 * g / 4;
      var y = Yb(yv);
      under.appendChild(svg('line', {class: 'grid', x1: L, x2: W - R, y1: y, y2: y}));
      under.appendChild(svg('text', {x: L - 6, y: y + 4, 'text-anchor': 'end'}, fmtBytes(Math.round(yv))));
      under.appendChild(svg('text', {x: W - R + 6, y: y + 4}, fmtInt(Math.round(maxBlocks * 1.1 * g / 4))));
    }
    under.appendChild(svg('line', {class: 'axis', x1: L, x2: W - R, y1: T + PLOT, y2: T + PLOT}));
    under.appendChild(svg('line', {class: 'axis', x1: L, x2: L, y1: T - 4, y2: T + PLOT}));
    under.appendChild(svg('line', {class: 'axis', x1: W - R, x2: W - R, y1: T - 4, y2: T + PLOT}));
    under.appendChild(svg('text', {x: L - 6, y: 14, 'text-anchor': 'end'}, 'live bytes'));
    under.appendChild(svg('text', {x: W - R + 6, y: 14}, 'live blocks'));
    snaps.forEach(function (s, i) {
      var cx = X(xs[i]);
      under.appendChild(svg('line', {class: 'grid', x1: cx, x2: cx, y1: T - 4, y2: T + PLOT}));
    });
    // one line per process: the heaps of two processes are not one curve
    procs.forEach(function (p, k) {
      var pb = [], pn = [];
      snaps.forEach(function (s, i) {
        if (s.process !== k) return;
        pb.push(X(xs[i]).toFixed(1) + ',' + Yb(s.live_bytes).toFixed(1));
        pn.push(X(xs[i]).toFixed(1) + ',' + Yn(s.live_blocks).toFixed(1));
      });
      under.appendChild(svg('polyline', {class: 'bytes', points: pb.join(' '), 'data-process': k,
                                         style: procs.length > 1 ? 'stroke:' + procColor(k) : null}));
      under.appendChild(svg('polyline', {class: 'blocks', points: pn.join(' '), 'data-process': k}));
    });
    var detail = el('p', {class: 'note', id: 'fx-point'}, 'Click a point for its snapshot.');
    snaps.forEach(function (s, i) {
      var cx = X(xs[i]);
      root.appendChild(svg('circle', {class: 'pt-blocks', cx: cx, cy: Yn(s.live_blocks), r: 3}));
      var pt = svg('circle', {class: 'pt-bytes' + (i === data.primary ? ' primary' : ''),
                              cx: cx, cy: Yb(s.live_bytes), r: 5, 'data-point': i, 'data-pid': s.pid,
                              'data-reason': s.reason, 'data-bytes': s.live_bytes,
                              'data-blocks': s.live_blocks,
                              style: procs.length > 1 ? 'fill:' + procColor(s.process) : null},
                       svg('title', null, s.reason + ' (pid ' + s.pid + ', ' + timeText(xs[i]) + '): ' +
                           fmtBytes(s.live_bytes) + ' in ' + fmtInt(s.live_blocks) + ' blocks'));
      pt.addEventListener('click', function () {
        detail.textContent = '';
        detail.appendChild(document.createTextNode(
          'Snapshot ' + (i + 1) + ' (' + s.reason + ', pid ' + s.pid + ', ' + fmtTime(s.time) + '): ' +
          fmtBytes(s.live_bytes) + ' live in ' + fmtInt(s.live_blocks) + ' blocks, ' +
          fmtBytes(s.freed_bytes) + (PLAIN ? ' free in glibc\'s tcaches and bins in ' : ' freed in quarantine in ') +
          fmtInt(s.freed_blocks) + ' blocks; core '));
        detail.appendChild(el('code', null, s.core));
      });
      root.appendChild(pt);
    });
    recordBoxes(reasonLabels);
    recordBoxes(timeLabels);
    var hidden = reasonLabels.concat(timeLabels).filter(function (lb) { return lb.row < 0; }).length;
    var legend = [
      el('span', null, [el('i', {class: 'lg-bytes'}), 'live bytes (left axis)']),
      el('span', null, [el('i', {class: 'lg-blocks'}), 'live blocks (right axis)']),
      el('span', null, 'x: time since the first snapshot' + (useTime ? '' : ' (unknown: in order given)'))
    ];
    if (procs.length > 1) {
      procs.forEach(function (p, k) {
        legend.push(el('span', null, [el('i', {style: 'background:' + procColor(k)}), 'pid ' + p.pid]));
      });
    }
    if (hidden) legend.push(el('span', null, hidden + ' label' + (hidden === 1 ? '' : 's') +
                                              ' left out where points crowd: hover a point'));
    host.appendChild(el('p', {class: 'legend note'}, legend));
    host.appendChild(detail);
  }
  drawCurve(section('Live heap over the snapshots', 'fx-curve-section',
                    'Each point is one core; its label above is why the core was taken.'));

  // ---------------------------------------------------------- hierarchy --

  /* Without libtag: the newest core's chunks in use by usable size (each
   * exact size one row), most bytes first, in place of the hierarchy. */
  function drawSizes() {
    var MAX = 500;
    var rows = data.size_classes;
    var total = rows.reduce(function (a, r) { return a + r.bytes; }, 0);
    var sec = section('Heap by chunk size', 'fx-sizes-section',
      'The chunks in use of the newest core by usable size (glibc\'s malloc_usable_size; each exact size is ' +
      'one row), most bytes first: without libtag there are no allocation stacks, so no hierarchy. ' +
      fmtInt(data.distinct_sizes) + ' distinct sizes' +
      (rows.length < data.distinct_sizes ? '; the ' + fmtInt(rows.length) + ' holding the most bytes are listed.' : '.'));
    var tb = el('tbody');
    rows.slice(0, MAX).forEach(function (r) {
      tb.appendChild(el('tr', {'data-size': r.usable_size, 'data-chunks': r.chunks, 'data-bytes': r.bytes}, [
        el('td', {class: 'num'}, fmtInt(r.usable_size)), el('td', {class: 'num'}, fmtInt(r.chunks)),
        el('td', {class: 'num'}, fmtBytes(r.bytes)),
        el('td', {class: 'num'}, (100 * r.bytes / Math.max(1, total)).toFixed(1) + '%')]));
    });
    sec.appendChild(el('table', {id: 'fx-sizes', 'data-rows': Math.min(rows.length, MAX)}, [
      el('thead', null, el('tr', null, [el('th', {class: 'num'}, 'usable size'), el('th', {class: 'num'}, 'chunks'),
                                         el('th', {class: 'num'}, 'bytes'), el('th', {class: 'num'}, 'share')])),
      tb]));
    if (rows.length > MAX) sec.appendChild(el('p', {class: 'note'}, 'first ' + MAX + ' sizes shown'));
  }

  if (PLAIN) drawSizes(); else {
    var tree = data.tree;
    var N = tree.parent.length;
    var kids = [];
    var depth = new Array(N), x0s = new Array(N);
    for (var i = 0; i < N; i++) kids.push([]);
    for (i = 1; i < N; i++) kids[tree.parent[i]].push(i);
    kids.forEach(function (k) { k.sort(function (a, b) { return tree.bytes[b] - tree.bytes[a] || a - b; }); });
    var maxDepth = 0;
    (function layout() {
      depth[0] = 0; x0s[0] = 0;
      var stack = [0];
      while (stack.length) {
        var n = stack.pop();
        var x = x0s[n];
        for (var j = 0; j < kids[n].length; j++) {
          var c = kids[n][j];
          depth[c] = depth[n] + 1;
          if (depth[c] > maxDepth) maxDepth = depth[c];
          x0s[c] = x;
          x += tree.bytes[c];
          stack.push(c);
        }
      }
    })();
    function nodeName(n) {
      if (n === 0) return 'all live blocks';
      if (tree.label[String(n)]) return tree.label[String(n)];
      return frameName(tree.frame[n]);
    }
    function hue(s) {
      var h = 0;
      for (var j = 0; j < s.length; j++) h = (h * 31 + s.charCodeAt(j)) >>> 0;
      return h;
    }
    function nodeColor(n) {
      if (n === 0) return 'hsl(220, 14%, 80%)';
      if (tree.frame[n] < 0) return 'hsl(0, 0%, 78%)';
      var h = hue(nodeName(n));
      return 'hsl(' + (10 + h % 45) + ', ' + (62 + (h >> 8) % 25) + '%, ' + (58 + (h >> 16) % 14) + '%)';
    }

    var ROW = 20;
    var flameSec = section('Allocation hierarchy', 'fx-flame-section',
                           'Live bytes of the newest snapshot by allocation stack, outermost frame on top; ' +
                           'width is bytes. Click a frame to zoom in and see its stack; click the top bar to zoom out.');
    var resetBtn = el('button', {type: 'button', id: 'fx-reset'}, 'Zoom out');
    var zoomNote = el('span', {class: 'note', id: 'fx-zoom-note'});
    flameSec.appendChild(el('div', {class: 'toolbar'}, [resetBtn, zoomNote]));
    var flameHost = el('div', {class: 'flame'});
    var panel = el('div', {class: 'panel', id: 'fx-stack', 'data-node': ''},
                   el('p', {class: 'note'}, 'Click a frame in the hierarchy (or a row of the table) to see its stack here.'));
    flameSec.appendChild(el('div', {class: 'flame-wrap'}, [flameHost, panel]));
    var flame = svg('svg', {class: 'chart', id: 'fx-flame', 'data-nodes': N, 'data-drawn': 0});
    flameHost.appendChild(flame);
    var zoomed = 0, selected = -1;

    function isAncestor(a, n) {  // a is n or an ancestor of n
      while (n > 0 && n !== a) n = tree.parent[n];
      return n === a;
    }
    function drawFlame() {
      var W = Math.max(400, Math.floor(flameHost.clientWidth || 1000));
      var H = (maxDepth + 1) * ROW + 2;
      flame.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
      flame.setAttribute('width', W);
      flame.setAttribute('height', H);
      while (flame.firstChild) flame.removeChild(flame.firstChild);
      var zb = Math.max(1, tree.bytes[zoomed]), zx = x0s[zoomed];
      var drawn = 0;
      var frag = document.createDocumentFragment();
      function put(n, x, w) {
        var y = depth[n] * ROW;
        var name = nodeName(n);
        var cls = 'fx-node' + (n === selected ? ' selected' : '') +
                  (n !== zoomed && isAncestor(n, zoomed) ? ' dim' : '');
        var g = svg('g', {class: cls, 'data-node': n, 'data-name': name,
                          'data-function': tree.frame[n] >= 0 ? (frames[tree.frame[n]].function || '') : '',
                          'data-bytes': tree.bytes[n], 'data-blocks': tree.blocks[n]});
        g.appendChild(svg('rect', {x: x.toFixed(2), y: y, width: Math.max(0.5, w - 0.5).toFixed(2),
                                   height: ROW - 1, fill: nodeColor(n)}));
        g.appendChild(svg('title', null, name + ' - ' + fmtBytes(tree.bytes[n]) + ' in ' +
                          fmtInt(tree.blocks[n]) + ' blocks' +
                          (tree.frame[n] >= 0 && frameWhere(tree.frame[n]) ? '\n' + frameWhere(tree.frame[n]) : '')));
        var chars = Math.floor((w - 6) / 6.6);
        if (chars >= 3) {
          var text = name + ' (' + fmtBytes(tree.bytes[n]) + ')';
          if (text.length > chars) text = name.length > chars ? name.slice(0, chars - 1) + '\u2026' : name;
          g.appendChild(svg('text', {x: (x + 3).toFixed(2), y: y + ROW - 6}, text));
        }
        frag.appendChild(g);
        drawn += 1;
      }
      // the zoomed node's ancestors span the whole width
      var chain = [];
      for (var a = zoomed; a > 0; a = tree.parent[a]) chain.push(a);
      chain.push(0);
      chain.reverse();
      chain.slice(0, -1).forEach(function (a) { put(a, 0, W); });
      // the zoomed subtree, scaled to the width; nodes under half a pixel are left out
      var todo = [zoomed];
      while (todo.length) {
        var n = todo.pop();
        var w = tree.bytes[n] / zb * W;
        if (n !== zoomed && w < 0.5) continue;
        put(n, (x0s[n] - zx) / zb * W, n === zoomed ? W : w);
        for (var j = kids[n].length - 1; j >= 0; j--) todo.push(kids[n][j]);
      }
      flame.appendChild(frag);
      flame.setAttribute('data-drawn', drawn);
      flame.setAttribute('data-zoom', zoomed);
      zoomNote.textContent = zoomed === 0 ? fmtBytes(tree.bytes[0]) + ' in ' + fmtInt(tree.blocks[0]) +
        ' blocks, ' + fmtInt(N - 1) + ' frames' : 'zoomed into ' + nodeName(zoomed) + ': ' +
        fmtBytes(tree.bytes[zoomed]) + ' (' + (100 * tree.bytes[zoomed] / Math.max(1, tree.bytes[0])).toFixed(1) + '%)';
    }

    function showStack(n) {
      panel.textContent = '';
      panel.setAttribute('data-node', n);
      var path = [];
      for (var a = n; a > 0; a = tree.parent[a]) if (tree.frame[a] >= 0) path.push(a);
      var selfBytes = tree.bytes[n], selfBlocks = tree.blocks[n];
      kids[n].forEach(function (c) { selfBytes -= tree.bytes[c]; selfBlocks -= tree.blocks[c]; });
      panel.appendChild(el('h3', null, nodeName(n)));
      panel.appendChild(el('p', {class: 'note'},
        fmtBytes(tree.bytes[n]) + ' (' + fmtInt(tree.bytes[n]) + ' bytes) in ' + fmtInt(tree.blocks[n]) +
        ' live blocks under this frame; ' + fmtBytes(selfBytes) + ' in ' + fmtInt(selfBlocks) +
        ' blocks allocated exactly here.'));
      panel.appendChild(el('p', {class: 'note'}, n === 0 ? 'The root: every live block.' :
                                                     'Stack, innermost first:'));
      if (n === 0) return;
      var list = el('ol', {class: 'frames'}, path.map(function (a) {
        var f = tree.frame[a];
        var more = tree.sites[String(a)];
        var where = frameWhere(f);
        if (more) {  // one function reached from several call sites: name them all
          var file = frames[f].file;
          var same = more.every(function (m) { return frames[m].file === file; });
          where = same && file ? file + ': lines ' + more.map(function (m) { return frames[m].line; }).join(', ')
                               : more.map(frameWhere).join(', ');
        }
        return el('li', {'data-function': frames[f].function || '', 'data-sites': more ? more.length : 1}, [
          el('span', {class: 'addr'}, more ? '' : frames[f].address + ' '),
          el('span', {class: 'fn'}, frameName(f)),
          where ? el('span', {class: 'where'}, ' at ' + where) : null
        ]);
      }));
      panel.appendChild(list);
    }

    select = function (n) {
      selected = n;
      zoomed = n;
      drawFlame();
      showStack(n);
    };
    flame.addEventListener('click', function (e) {
      var g = e.target.closest ? e.target.closest('.fx-node') : null;
      if (!g) return;
      var n = Number(g.getAttribute('data-node'));
      // a click on an ancestor bar (drawn full width) zooms out to it
      select(n);
    });
    resetBtn.addEventListener('click', function () { selected = -1; zoomed = 0; drawFlame(); });
    drawFlame();
    var resizeTimer = null;
    window.addEventListener('resize', function () {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(drawFlame, 100);
    });
  }

  // ------------------------------------------------------ C++ classes --

  /* The newest core's live blocks by C++ class (told by the vtable pointer
   * in a block's first word, or a std::string's characters), most bytes
   * first: with libtag and without.  No section when no class was told. */
  (function drawTypes() {
    var rows = data.types || [];
    if (!rows.length) return;
    var sec = section('Heap by C++ class', 'fx-types-section',
      'The live blocks of the newest core whose class can be told (by the vtable pointer in the block\'s ' +
      'first word; "std::string buffer": a std::string\'s characters), most bytes first. Blocks whose class ' +
      'cannot be told are not counted.');
    var tb = el('tbody');
    rows.forEach(function (r) {
      tb.appendChild(el('tr', {'data-type': r.type, 'data-blocks': r.blocks, 'data-bytes': r.bytes}, [
        el('td', null, r.type), el('td', {class: 'num'}, fmtInt(r.blocks)),
        el('td', {class: 'num'}, fmtBytes(r.bytes))]));
    });
    sec.appendChild(el('table', {id: 'fx-types', 'data-rows': rows.length}, [
      el('thead', null, el('tr', null, [el('th', null, 'class'), el('th', {class: 'num'}, 'blocks'),
                                         el('th', {class: 'num'}, 'bytes')])),
      tb]));
  })();

  // ------------------------------------------------- anomalies, crashes --

  var evSec = section('Anomalies and crashes', 'fx-events-section');
  var evHost = el('div', {class: 'events', id: 'fx-events', 'data-count': data.events.length});
  evSec.appendChild(evHost);
  if (!data.events.length) evHost.appendChild(el('p', {class: 'note'}, 'No anomaly or crash in these cores.'));
  data.events.forEach(function (ev) {
    var seen = ev.cores.length;
    var card = el('article', {class: 'event', 'data-kind': ev.kind, 'data-seen': seen}, [
      el('h3', null, ev.title),
      seen > 1 ? el('p', {class: 'seen'}, 'seen in ' + seen + ' cores') : null]);
    var dl = el('dl', {class: 'facts'});
    ev.facts.forEach(function (f) { dl.appendChild(el('dt', null, f[0])); dl.appendChild(el('dd', {class: 'mono'}, f[1])); });
    dl.appendChild(el('dt', null, seen > 1 ? 'cores' : 'core'));
    dl.appendChild(el('dd', {class: 'mono'}, ev.cores.map(function (c) { return el('div', null, c); })));
    card.appendChild(dl);
    card.appendChild(el('div', {class: 'stacks'}, ev.stacks.map(function (s) {
      return el('div', {class: 'stack', 'data-title': s.title}, [el('h3', null, s.title), frameList(s.frames)]);
    })));
    evHost.appendChild(card);
  });

  // ------------------------------------------------------------- leaks --

  var lkSec = section('Leaks', 'fx-leaks-section');
  if (data.leaks === null) {
    lkSec.appendChild(el('p', {class: 'note', id: 'fx-leaks', 'data-count': ''},
                         'Leak groups were not computed: this version of forensics has no leak scan.'));
  } else if (!data.leaks.length) {
    lkSec.appendChild(el('p', {class: 'note', id: 'fx-leaks', 'data-count': 0}, 'No leaked blocks found.'));
  } else {
    var lt = el('table', {id: 'fx-leaks', 'data-count': data.leaks.length}, [
      el('thead', null, el('tr', null, [el('th', null, 'kind'), el('th', {class: 'num'}, 'blocks'),
                                         el('th', {class: 'num'}, 'bytes'),
                                         el('th', null, PLAIN ? 'usable size (no stacks without libtag)' : 'allocated at')]))]);
    var lb = el('tbody');
    data.leaks.forEach(function (g) {
      lb.appendChild(el('tr', {'data-kind': g.kind, 'data-size': PLAIN ? g.usable_size : null,
                               'data-blocks': PLAIN ? g.blocks : null}, [
        el('td', null, g.kind), el('td', {class: 'num'}, fmtInt(g.blocks)),
        el('td', {class: 'num'}, fmtBytes(g.bytes)),
        PLAIN ? el('td', {class: 'mono'}, fmtInt(g.usable_size) + ' bytes each')
              : el('td', null, el('details', null, [siteSummary(g.frames, g.site), frameList(g.frames)]))]));
    });
    lt.appendChild(lb);
    lkSec.appendChild(lt);
  }

  // ------------------------------------------------------- stack table --

  if (!PLAIN) {
    var MAX_ROWS = 500;
    var tSec = section('Allocation stacks', 'fx-table-section',
                       fmtInt(data.distinct_stacks) + ' distinct stacks hold live blocks in the newest snapshot' +
                       (data.stacks.length < data.distinct_stacks ? '; the ' + fmtInt(data.stacks.length) +
                        ' holding the most bytes are listed.' : '.') + ' Click a row to find it in the hierarchy.');
    var filter = el('input', {type: 'search', id: 'fx-filter', placeholder: 'filter by function or file', 'aria-label': 'filter stacks'});
    var countNote = el('span', {class: 'note', id: 'fx-count'});
    tSec.appendChild(el('div', {class: 'toolbar'}, [filter, countNote]));
    var cols = [
      {key: 'rank', title: '#', num: true},
      {key: 'bytes', title: 'live bytes', num: true},
      {key: 'blocks', title: 'live blocks', num: true},
      {key: 'avg', title: 'avg size', num: true},
      {key: 'peak', title: 'peak bytes', num: true},
      {key: 'temps', title: 'temporary', num: true},
      {key: 'site', title: 'allocated at'},
      {key: 'stack', title: 'stack'}
    ];
    var NOT_RECORDED = -1;
    var rows = data.stacks.map(function (s, i) {
      var text = s.frames.map(function (f) { return (frameName(f) + ' ' + frameWhere(f)).toLowerCase(); }).join('\n');
      return {rank: i + 1, bytes: s.bytes, blocks: s.blocks, avg: s.blocks ? s.bytes / s.blocks : 0,
              peak: data.stack_stats && s.peak_bytes !== null ? s.peak_bytes : NOT_RECORDED,
              temps: data.stack_stats && s.temporaries !== null ? s.temporaries : NOT_RECORDED,
              allocs: data.stack_stats ? s.allocs : null,
              site: siteText(s.frames, s.site), siteFn: s.frames.length ? frames[s.frames[s.site]].function || '' : '',
              frames: s.frames, node: s.node, text: text, blockList: s.block_list || []};
    });
    tSec.appendChild(el('p', {class: 'note', id: 'fx-stats-note', 'data-recorded': data.stack_stats ? 1 : 0},
      data.stack_stats
        ? 'peak bytes: the most this stack held live at once; temporary: its blocks freed soon after they ' +
          'were made (libtag\'s per-stack counters; stacks with no live block are listed when they peaked or ' +
          'churned the most).'
        : 'peak bytes and temporary allocations: not recorded (the libtag that ran the program kept no ' +
          'per-stack counters).'));
    var rt = data.runtime || {stacks: 0};
    if (rt.stacks && !rt.shown) {
      tSec.appendChild(el('p', {class: 'note', id: 'fx-runtime', 'data-blocks': rt.blocks, 'data-bytes': rt.bytes,
                                'data-stacks': rt.stacks},
        'runtime: ' + fmtInt(rt.blocks) + (rt.blocks === 1 ? ' block, ' : ' blocks, ') + fmtInt(rt.bytes) +
        (rt.bytes === 1 ? ' byte in ' : ' bytes in ') + fmtInt(rt.stacks) + (rt.stacks === 1 ? ' stack' : ' stacks') +
        ' of the C and C++ runtimes (stdio buffers, libstdc++\'s emergency pool, the loader\'s TLS), not listed: ' +
        'one node of the hierarchy (forensics report --runtime lists them).'));
    }
    tSec.appendChild(el('p', {class: 'note'}, 'allocated at: the first frame outside the allocation wrappers (' +
      data.wrappers.length + ' patterns: malloc\'s family, strdup, operator new, the xmalloc family; ' +
      'forensics report --wrapper PATTERN adds one).'));
    var sortKey = 'bytes', sortDir = -1;
    var heads = cols.map(function (c) {
      return el('th', {'data-sort': c.key === 'stack' ? null : c.key, class: c.num ? 'num' : null,
                       'aria-sort': c.key === sortKey ? 'descending' : null}, c.title);
    });
    var tbody = el('tbody');
    var table = el('table', {id: 'fx-table', 'data-rows': 0}, [el('thead', null, el('tr', null, heads)), tbody]);
    tSec.appendChild(table);

    function drawTable() {
      var q = filter.value.trim().toLowerCase();
      var shown = rows.filter(function (r) { return !q || r.text.indexOf(q) >= 0; });
      shown.sort(function (a, b) {
        var x = a[sortKey], y = b[sortKey];
        var c = typeof x === 'string' ? x.localeCompare(y) : x - y;
        return c * sortDir || a.rank - b.rank;
      });
      tbody.textContent = '';
      var frag = document.createDocumentFragment();
      shown.slice(0, MAX_ROWS).forEach(function (r) {
        var tr = el('tr', {'data-node': r.node, 'data-bytes': r.bytes, 'data-blocks': r.blocks,
                           'data-peak': r.peak === NOT_RECORDED ? '' : r.peak,
                           'data-temporaries': r.temps === NOT_RECORDED ? '' : r.temps,
                           'data-site': r.siteFn}, [
          el('td', {class: 'num'}, r.rank), el('td', {class: 'num'}, fmtBytes(r.bytes)),
          el('td', {class: 'num'}, fmtInt(r.blocks)), el('td', {class: 'num'}, r.blocks ? fmtBytes(Math.round(r.avg)) : ''),
          el('td', {class: 'num' + (r.peak === NOT_RECORDED ? ' nr' : '')},
             r.peak === NOT_RECORDED ? 'not recorded' : fmtBytes(r.peak)),
          el('td', {class: 'num' + (r.temps === NOT_RECORDED ? ' nr' : '')},
             r.temps === NOT_RECORDED ? 'not recorded' : fmtInt(r.temps) +
               (r.allocs ? ' of ' + fmtInt(r.allocs) : '')),
          el('td', {class: 'mono'}, r.site),
          el('td', null, [el('details', null, [el('summary', null, r.frames.length + ' frames'), frameList(r.frames)]),
                          blockDetails(r)])]);
        tr.addEventListener('click', function (e) {
          if (e.target.closest && e.target.closest('details')) return;
          if (r.node < 0) return;  // no live block: not in the hierarchy
          select(r.node);
          document.getElementById('fx-flame-section').scrollIntoView();
        });
        frag.appendChild(tr);
      });
      tbody.appendChild(frag);
      table.setAttribute('data-rows', Math.min(shown.length, MAX_ROWS));
      countNote.textContent = shown.length + ' of ' + rows.length + ' stacks' +
        (shown.length > MAX_ROWS ? ' (first ' + MAX_ROWS + ' shown)' : '');
    }
    heads.forEach(function (th) {
      var key = th.getAttribute('data-sort');
      if (!key) return;
      th.addEventListener('click', function () {
        if (sortKey === key) sortDir = -sortDir; else { sortKey = key; sortDir = key === 'site' || key === 'rank' ? 1 : -1; }
        heads.forEach(function (h) { h.removeAttribute('aria-sort'); });
        th.setAttribute('aria-sort', sortDir > 0 ? 'ascending' : 'descending');
        drawTable();
      });
    });
    filter.addEventListener('input', drawTable);
    drawTable();
  }

  // ---------------------------------------------------------- warnings --

  if (data.warnings.length) {
    var wSec = section('Warnings', 'fx-warnings-section');
    wSec.appendChild(el('ul', {class: 'warn'}, data.warnings.map(function (w) { return el('li', null, w); })));
  }

  // ------------------------------------------------------- URL actions --

  /* #select=N clicks hierarchy node N; #sort=KEY clicks the column KEY's
   * header; #filter=TEXT types TEXT into the filter box: real events, so a
   * headless browser exercises what a user's click or typing does.
   * #scroll=ID scrolls element ID into view (a screenshot of that part). */
  function applyHash() {
    var params = {};
    location.hash.replace(/^#/, '').split('&').forEach(function (kv) {
      var k = kv.indexOf('=');
      if (k > 0) params[kv.slice(0, k)] = decodeURIComponent(kv.slice(k + 1));
    });
    if (PLAIN && (params.filter !== undefined || params.sort !== undefined || params.select !== undefined)) {
      recordError('#filter, #sort and #select need the stack table and hierarchy: cores without libtag have none');
      return;
    }
    if (params.filter !== undefined) {
      filter.value = params.filter;
      filter.dispatchEvent(new Event('input', {bubbles: true}));
    }
    if (params.sort !== undefined) {
      var th = table.querySelector('th[data-sort="' + params.sort.replace(/[^a-z]/g, '') + '"]');
      if (!th) recordError('#sort: no column ' + params.sort);
      else th.dispatchEvent(new MouseEvent('click', {bubbles: true, cancelable: true, view: window}));
    }
    if (params.scroll !== undefined) {
      var target = document.getElementById(params.scroll);
      if (!target) recordError('#scroll: no element ' + params.scroll);
      else target.scrollIntoView();
    }
    if (params.select !== undefined) {
      var g = flame.querySelector('.fx-node[data-node="' + Number(params.select) + '"]');
      if (!g) { recordError('#select: node ' + params.select + ' is not drawn'); return; }
      g.querySelector('rect').dispatchEvent(new MouseEvent('click', {bubbles: true, cancelable: true, view: window}));
    }
  }
  applyHash();
  window.addEventListener('hashchange', applyHash);
  status.setAttribute('data-render-ms', window.performance ? (performance.now() - t0).toFixed(1) : '');
  status.setAttribute('data-ready', '1');
})();
