/* forensics report: draws the page from the JSON in #fx-data (inlined by
 * forensics/report.py).  Plain DOM and SVG, no libraries, no network.
 *
 * Every string from the core reaches the DOM through textContent or
 * setAttribute, never as markup.  Errors (thrown here or reported by the
 * browser) are listed in #fx-status, whose data-errors attribute counts them,
 * so a headless browser's DOM dump shows whether the page ran cleanly.
 *
 * URL hash (applied once the page is drawn): #select=N, #sort=KEY,
 * #filter=TEXT - see applyHash.
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
          node.setAttribute(k, String(attrs[k]));
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

  function frameName(i) {
    var f = frames[i];
    if (!f) return '??';
    if (f.function) return f.function;
    return (f.module ? basename(f.module) + '+' : '') + f.address;
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
        el('span', {class: 'addr'}, frames[i] ? frames[i].address + ' ' : ''),
        el('span', {class: 'fn'}, frameName(i)),
        frameWhere(i) ? el('span', {class: 'where'}, ' at ' + frameWhere(i)) : null
      ]);
    }));
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

  app.appendChild(el('h1', null, data.title));
  app.appendChild(el('p', {class: 'sub'}, [
    snaps.length + ' snapshot' + (snaps.length === 1 ? '' : 's') + '; hierarchy and table of ',
    el('code', null, primary.core),
    ' (' + primary.reason + ', ' + fmtTime(primary.time) + '): ' + fmtBytes(primary.live_bytes) +
      ' live in ' + fmtInt(primary.live_blocks) + ' blocks. Generated ' + data.generated + '.'
  ]));

  // ------------------------------------------------------------- curve --

  function drawCurve(host) {
    var W = 1200, H = 290, L = 80, R = 80, T = 50, B = 40;
    var n = snaps.length;
    var times = snaps.map(function (s, i) { return s.time === null ? null : s.time; });
    var useTime = times.every(function (t) { return t !== null; });
    var xs = useTime ? times : snaps.map(function (s, i) { return i; });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var maxBytes = Math.max(1, Math.max.apply(null, snaps.map(function (s) { return s.live_bytes; })));
    var maxBlocks = Math.max(1, Math.max.apply(null, snaps.map(function (s) { return s.live_blocks; })));
    function X(v) { return x1 === x0 ? L + (W - L - R) / 2 : L + (v - x0) / (x1 - x0) * (W - L - R); }
    function Yb(v) { return H - B - v / (maxBytes * 1.1) * (H - B - T); }
    function Yn(v) { return H - B - v / (maxBlocks * 1.1) * (H - B - T); }
    var root = svg('svg', {class: 'chart', id: 'fx-curve', viewBox: '0 0 ' + W + ' ' + H,
                           role: 'img', 'aria-label': 'live heap over the snapshots',
                           'data-points': n});
    for (var g = 0; g <= 4; g++) {
      var yv = maxBytes * 1.1 * g / 4;
      var y = Yb(yv);
      root.appendChild(svg('line', {class: 'grid', x1: L, x2: W - R, y1: y, y2: y}));
      root.appendChild(svg('text', {x: L - 6, y: y + 4, 'text-anchor': 'end'}, fmtBytes(Math.round(yv))));
      root.appendChild(svg('text', {x: W - R + 6, y: y + 4},
                           fmtInt(Math.round(maxBlocks * 1.1 * g / 4))));
    }
    root.appendChild(svg('line', {class: 'axis', x1: L, x2: W - R, y1: H - B, y2: H - B}));
    root.appendChild(svg('line', {class: 'axis', x1: L, x2: L, y1: T - 10, y2: H - B}));
    root.appendChild(svg('line', {class: 'axis', x1: W - R, x2: W - R, y1: T - 10, y2: H - B}));
    root.appendChild(svg('text', {x: L - 6, y: 14, 'text-anchor': 'end'}, 'live bytes'));
    root.appendChild(svg('text', {x: W - R + 6, y: 14}, 'live blocks'));
    var pb = [], pn = [];
    snaps.forEach(function (s, i) {
      pb.push(X(xs[i]).toFixed(1) + ',' + Yb(s.live_bytes).toFixed(1));
      pn.push(X(xs[i]).toFixed(1) + ',' + Yn(s.live_blocks).toFixed(1));
    });
    root.appendChild(svg('polyline', {class: 'bytes', points: pb.join(' ')}));
    root.appendChild(svg('polyline', {class: 'blocks', points: pn.join(' ')}));
    var detail = el('p', {class: 'note', id: 'fx-point'}, 'Click a point for its snapshot.');
    snaps.forEach(function (s, i) {
      var cx = X(xs[i]);
      var label = useTime ? '+' + (xs[i] - x0).toFixed(3) + ' s' : '#' + (i + 1);
      root.appendChild(svg('line', {class: 'grid', x1: cx, x2: cx, y1: T - 14, y2: H - B}));
      root.appendChild(svg('text', {x: cx, y: H - B + 16, 'text-anchor': 'middle'}, label));
      root.appendChild(svg('text', {class: 'reason' + (s.reason === 'on-demand' ? '' : ' bad'),
                                    x: cx, y: T - 20, 'text-anchor': 'middle', 'data-reason': s.reason},
                           s.reason));
      root.appendChild(svg('circle', {class: 'pt-blocks', cx: cx, cy: Yn(s.live_blocks), r: 3}));
      var pt = svg('circle', {class: 'pt-bytes' + (i === data.primary ? ' primary' : ''),
                              cx: cx, cy: Yb(s.live_bytes), r: 5, 'data-point': i,
                              'data-reason': s.reason, 'data-bytes': s.live_bytes,
                              'data-blocks': s.live_blocks},
                       svg('title', null, s.reason + ': ' + fmtBytes(s.live_bytes) + ' in ' +
                           fmtInt(s.live_blocks) + ' blocks'));
      pt.addEventListener('click', function () {
        detail.textContent = '';
        detail.appendChild(document.createTextNode(
          'Snapshot ' + (i + 1) + ' (' + s.reason + ', pid ' + s.pid + ', ' + fmtTime(s.time) + '): ' +
          fmtBytes(s.live_bytes) + ' live in ' + fmtInt(s.live_blocks) + ' blocks, ' +
          fmtBytes(s.freed_bytes) + ' freed in quarantine in ' + fmtInt(s.freed_blocks) + ' blocks; core '));
        detail.appendChild(el('code', null, s.core));
      });
      root.appendChild(pt);
    });
    host.appendChild(root);
    host.appendChild(el('p', {class: 'legend note'}, [
      el('span', null, [el('i', {class: 'lg-bytes'}), 'live bytes (left axis)']),
      el('span', null, [el('i', {class: 'lg-blocks'}), 'live blocks (right axis)']),
      el('span', null, 'x: time since the first snapshot' + (useTime ? '' : ' (unknown: in order given)'))
    ]));
    host.appendChild(detail);
  }
  drawCurve(section('Live heap over the snapshots', 'fx-curve-section',
                    'Each point is one core; its label is why the core was taken.'));

  // ---------------------------------------------------------- hierarchy --

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

  function select(n) {
    selected = n;
    zoomed = n;
    drawFlame();
    showStack(n);
  }
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

  // ------------------------------------------------- anomalies, crashes --

  var evSec = section('Anomalies and crashes', 'fx-events-section');
  var evHost = el('div', {class: 'events', id: 'fx-events', 'data-count': data.events.length});
  evSec.appendChild(evHost);
  if (!data.events.length) evHost.appendChild(el('p', {class: 'note'}, 'No anomaly or crash in these cores.'));
  data.events.forEach(function (ev) {
    var card = el('article', {class: 'event', 'data-kind': ev.kind}, el('h3', null, ev.title));
    var dl = el('dl', {class: 'facts'});
    ev.facts.forEach(function (f) { dl.appendChild(el('dt', null, f[0])); dl.appendChild(el('dd', {class: 'mono'}, f[1])); });
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
                                         el('th', {class: 'num'}, 'bytes'), el('th', null, 'allocated at')]))]);
    var lb = el('tbody');
    data.leaks.forEach(function (g) {
      lb.appendChild(el('tr', {'data-kind': g.kind}, [
        el('td', null, g.kind), el('td', {class: 'num'}, fmtInt(g.blocks)),
        el('td', {class: 'num'}, fmtBytes(g.bytes)),
        el('td', null, el('details', null, [el('summary', null, g.frames.length ? frameName(g.frames[0]) : '(no stack)'),
                                            frameList(g.frames)]))]));
    });
    lt.appendChild(lb);
    lkSec.appendChild(lt);
  }

  // ------------------------------------------------------- stack table --

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
    {key: 'bytes', title: 'bytes', num: true},
    {key: 'blocks', title: 'blocks', num: true},
    {key: 'avg', title: 'avg size', num: true},
    {key: 'site', title: 'allocated at'},
    {key: 'stack', title: 'stack'}
  ];
  var rows = data.stacks.map(function (s, i) {
    var text = s.frames.map(function (f) { return (frameName(f) + ' ' + frameWhere(f)).toLowerCase(); }).join('\n');
    return {rank: i + 1, bytes: s.bytes, blocks: s.blocks, avg: s.blocks ? s.bytes / s.blocks : 0,
            site: s.frames.length ? frameName(s.frames[0]) : '', frames: s.frames, node: s.node, text: text};
  });
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
      var tr = el('tr', {'data-node': r.node, 'data-bytes': r.bytes, 'data-blocks': r.blocks}, [
        el('td', {class: 'num'}, r.rank), el('td', {class: 'num'}, fmtBytes(r.bytes)),
        el('td', {class: 'num'}, fmtInt(r.blocks)), el('td', {class: 'num'}, fmtBytes(Math.round(r.avg))),
        el('td', {class: 'mono'}, r.site),
        el('td', null, el('details', null, [el('summary', null, r.frames.length + ' frames'), frameList(r.frames)]))]);
      tr.addEventListener('click', function (e) {
        if (e.target.closest && e.target.closest('details')) return;
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

  // ---------------------------------------------------------- warnings --

  if (data.warnings.length) {
    var wSec = section('Warnings', 'fx-warnings-section');
    wSec.appendChild(el('ul', {class: 'warn'}, data.warnings.map(function (w) { return el('li', null, w); })));
  }

  // ------------------------------------------------------- URL actions --

  /* #select=N clicks hierarchy node N; #sort=KEY clicks the column KEY's
   * header; #filter=TEXT types TEXT into the filter box: real events, so a
   * headless browser exercises what a user's click or typing does. */
  function applyHash() {
    var params = {};
    location.hash.replace(/^#/, '').split('&').forEach(function (kv) {
      var k = kv.indexOf('=');
      if (k > 0) params[kv.slice(0, k)] = decodeURIComponent(kv.slice(k + 1));
    });
    if (params.filter !== undefined) {
      filter.value = params.filter;
      filter.dispatchEvent(new Event('input', {bubbles: true}));
    }
    if (params.sort !== undefined) {
      var th = table.querySelector('th[data-sort="' + params.sort.replace(/[^a-z]/g, '') + '"]');
      if (!th) recordError('#sort: no column ' + params.sort);
      else th.dispatchEvent(new MouseEvent('click', {bubbles: true, cancelable: true, view: window}));
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
