// Draws every chart of a vitscope report from the JSON embedded beside it (vitscope.viz.charts.Chart).
// Curves and bars: hover shows the values at a tick, a legend click hides a model (its baseline with it), a button
// switches log/linear where every value is positive. Heat maps: hover shows the cell. Each panel can be
// downloaded as PNG or SVG. One colour per colour key (a model) on the whole page. A bounded quantity (CKA, IoU,
// accuracies) is drawn on its fixed range; the legend (curves) or the colour bar (heat maps) notes the data's range.
(function () {
  "use strict";
  if (typeof echarts === "undefined") { return; }
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf"];  // matplotlib's tab10, as the PNG files
  var NEUTRAL = "#8c8c8c";
  var HEAT = {
    viridis: ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b",
              "#fde725"],
    inferno: ["#000004", "#1b0c41", "#4a0c6b", "#781c6d", "#a52c60", "#cf4446", "#ed6925", "#fb9b06", "#f7d13d",
              "#fcffa4"],
    diverging: ["#053061", "#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7", "#fddbc7", "#f4a582", "#d6604d",
                "#b2182b", "#67001f"]
  };
  var keysNode = document.getElementById("vs-colour-keys");
  var keys = keysNode ? JSON.parse(keysNode.textContent) : [];

  function keyIndex(key) {
    var i = keys.indexOf(key);
    if (i < 0) { keys.push(key); i = keys.length - 1; }
    return i;
  }

  function colourOf(key) {
    return key ? PALETTE[keyIndex(key) % PALETTE.length] : NEUTRAL;
  }

  // past the palette's ten colours a key repeats a colour: its marks and line pattern tell it apart
  var SYMBOLS = ["circle", "rect", "triangle", "diamond"];
  var PATTERNS = ["solid", [10, 3, 2, 3], [2, 3]];
  function lapOf(key) { return key ? Math.floor(keyIndex(key) / PALETTE.length) : 0; }

  var esc = echarts.format.encodeHTML;  // tooltips are HTML: names and labels come from the user (paths, ids)

  function fmt(v) {
    if (v === null || v === undefined || isNaN(v)) { return "none"; }
    var a = Math.abs(v);
    return (a !== 0 && (a < 1e-3 || a >= 1e5)) ? v.toExponential(3) : String(+v.toPrecision(4));
  }

  // legend rows a plain (wrapping) legend takes at this width: every model stays visible, below the plot
  function legendRows(p, width) {
    var names = [];
    p.curves.forEach(function (c) { if (names.indexOf(c.name) < 0) { names.push(c.name); } });
    if (p.range_note) { names.push(p.range_note); }
    var rows = 1, used = 0;
    names.forEach(function (n) {
      var w = 45 + 7 * String(n).length;
      if (used > 0 && used + w > width - 30) { rows += 1; used = 0; }
      used += w;
    });
    return rows;
  }

  var BAND_COLOURS = ["rgba(31,119,180,0.10)", "rgba(255,127,14,0.12)", "rgba(44,160,44,0.12)",
                      "rgba(148,103,189,0.12)"];
  var HATCH = {symbol: "rect", dashArrayX: [1, 0], dashArrayY: [3, 4], rotation: -Math.PI / 4,
               color: "rgba(255,255,255,0.75)"};

  function isBars(c) { return c.style === "bars" || c.style === "hatched_bars"; }

  // a band fills whole category slots (first to last tick, edges included): bars as tall as the value axis,
  // behind the curves, named once at their middle tick
  function bandSeries(p) {
    if (!(p.bands || []).length || p.x_kind === "value") { return []; }
    var top = p.y_range[1];
    if (top === null) {
      top = -Infinity;
      p.curves.forEach(function (c) {
        c.values.forEach(function (v) {
          (Array.isArray(v) ? v : [v]).forEach(function (w) { if (w !== null) { top = Math.max(top, w); } });
        });
      });
    }
    if (!isFinite(top)) { return []; }
    return p.bands.map(function (b, i) {
      var first = p.x_ticks.indexOf(b.first), last = p.x_ticks.indexOf(b.last), mid = Math.floor((first + last) / 2);
      var data = p.x_ticks.map(function (t, x) {
        if (x < first || x > last) { return "-"; }
        return x === mid ? {value: top, label: {show: true, position: "insideTop", formatter: b.name, color: "#333",
                                                fontSize: 11}} : top;
      });
      return {type: "bar", name: b.name, data: data, barWidth: "100%", barGap: "-100%", silent: true, z: 0,
              tooltip: {show: false}, itemStyle: {color: BAND_COLOURS[i % BAND_COLOURS.length]}};
    });
  }

  function lineOption(p, rows) {
    var series = [];
    var legend = [];
    var baselines = [];  // series index -> whether it is a reference line (its hover value says so)
    p.curves.forEach(function (c) {
      var colour = colourOf(c.colour), lap = lapOf(c.colour);
      if (legend.indexOf(c.name) < 0) { legend.push(c.name); }
      if (c.style === "dots") {
        var pts = [];
        c.values.forEach(function (row, x) {
          (Array.isArray(row) ? row : [row]).forEach(function (v) { if (v !== null) { pts.push([x, v]); } });
        });
        series.push({type: "scatter", name: c.name, data: pts, symbolSize: 5, itemStyle: {color: colour, opacity: 0.45},
                     tooltip: {show: false}, z: 1});
      } else if (isBars(c)) {
        series.push({type: "bar", name: c.name, data: c.values, z: 2, barMaxWidth: 48,
                     itemStyle: {color: colour, decal: c.style === "hatched_bars" || lap > 0 ? HATCH : undefined}});
      } else {
        var data = p.x_kind === "value" ? c.values.map(function (v, i) { return [c.x[i], v]; }) : c.values;
        var dash = c.style === "dashed" ? "dashed" : (c.style === "dotted" ? "dotted" : PATTERNS[lap % PATTERNS.length]);
        series.push({type: "line", name: c.name, data: data, connectNulls: false, z: 2,
                     symbol: c.baseline ? "none" : SYMBOLS[lap % SYMBOLS.length], symbolSize: 6,
                     itemStyle: {color: colour},
                     lineStyle: {color: colour, width: c.baseline ? 1.5 : 2, type: dash}});
      }
      baselines.push(!!c.baseline);
    });
    var bands = bandSeries(p);  // shaded stretches (stages) behind the curves, with their names at the top
    bands.forEach(function (b) { series.push(b); baselines.push(false); });
    if (p.range_note) {  // the data's own range on a fixed axis: a legend entry without a mark or a line
      series.push({type: "line", name: p.range_note, data: [], silent: true});
      legend.push({name: p.range_note, icon: "none", textStyle: {color: "#555"}});
    }
    var hasBars = p.curves.some(isBars);
    return {
      animation: false,
      title: p.title ? {text: p.title, left: "center", textStyle: {fontSize: 13, fontWeight: "normal"}} : undefined,
      legend: {type: "plain", bottom: 0, left: "center", data: legend},
      grid: {left: 64, right: 20, top: p.title ? 36 : 16,
             bottom: 50 + 22 * rows, containLabel: false},
      tooltip: {trigger: "axis", confine: true, axisPointer: {type: hasBars ? "shadow" : "line"},
                formatter: function (items) {
        var out = [];
        items.forEach(function (it) {
          if ((it.seriesType !== "line" && it.seriesType !== "bar") || it.seriesIndex >= p.curves.length) { return; }
          var v = Array.isArray(it.value) ? it.value[1] : it.value;
          out.push(it.marker + esc(it.seriesName) + (baselines[it.seriesIndex] ? " (baseline)" : "") + ": " + fmt(v));
        });
        var at = items[0].axisValue;
        return esc(p.x_label + " " + (typeof at === "number" ? fmt(at) : at)) + "<br>" + out.join("<br>");
      }},
      xAxis: p.x_kind === "value" ?
        {type: "value", name: p.x_label, nameLocation: "middle", nameGap: 26,
         min: p.x_range[0] === null ? undefined : p.x_range[0], max: p.x_range[1] === null ? undefined : p.x_range[1]} :
        {type: "category", data: p.x_ticks, name: p.x_label, nameLocation: "middle", nameGap: 26, boundaryGap: true},
      yAxis: {type: "value", name: p.y_label, nameLocation: "middle", nameGap: 48, scale: !hasBars,
              min: p.y_range[0] === null ? undefined : p.y_range[0],
              max: p.y_range[1] === null ? undefined : p.y_range[1]},
      series: series
    };
  }

  function longLabels(p) {  // names, not numbers: tilted under the map, which needs room
    return p.columns.some(function (c) { return String(c).length > 6; });
  }

  // every label of a heat map axis where they fit side by side (about 7 px a character), else as many as fit
  function labelEvery(labels, room, rotated) {
    var widest = Math.max.apply(null, labels.map(function (c) { return String(c).length; }).concat([1]));
    return room / Math.max(labels.length, 1) >= (rotated ? 14 : 7 * widest + 6) ? 0 : "auto";
  }

  function heatOption(p, width) {
    var data = [];
    var lo = Infinity, hi = -Infinity;
    p.values.forEach(function (row, r) {
      row.forEach(function (v, c) {
        data.push([c, r, v === null ? "-" : v]);
        if (v !== null) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
      });
    });
    if (!isFinite(lo)) { lo = 0; hi = 1; }
    if (p.value_range) { lo = p.value_range[0]; hi = p.value_range[1]; }
    if (p.colours === "diverging") { var m = Math.max(Math.abs(lo), Math.abs(hi)); lo = -m; hi = m; }
    if (lo === hi) { hi = lo + 1; }
    var cells = p.rows.length * p.columns.length;
    var long = longLabels(p);
    return {
      animation: false,
      title: p.title ? {text: p.title, left: "center", textStyle: {fontSize: 13, fontWeight: "normal"}} : undefined,
      grid: {left: 12, right: 100, top: p.title ? 48 : 28, bottom: 30, containLabel: true},
      tooltip: {trigger: "item", confine: true, formatter: function (it) {
        return esc(p.y_label + " " + p.rows[it.value[1]] + ", " + p.x_label + " " + p.columns[it.value[0]]) + "<br>" +
          esc(p.value_label) + ": " + fmt(it.value[2] === "-" ? null : it.value[2]);
      }},
      xAxis: {type: "category", data: p.columns, name: p.x_label, nameLocation: "middle", nameGap: long ? 70 : 26,
              splitArea: {show: false},
              axisLabel: {interval: labelEvery(p.columns, width - 180, long), rotate: long ? 35 : 0}},
      yAxis: {type: "category", data: p.rows, name: p.y_label, nameLocation: "start", inverse: true,
              axisLabel: {interval: p.rows.length <= 40 ? 0 : "auto"}},
      // the scale's ends once, beside the bar (draggable handles printed them a second time over the cells)
      visualMap: {min: lo, max: hi, calculable: false, orient: "vertical", right: 8, top: "middle",
                  itemHeight: 140, text: [fmt(hi), fmt(lo)], inRange: {color: HEAT[p.colours] || HEAT.viridis}},
      // on a fixed scale (a bounded quantity), where the data lie on it, under the colour bar
      graphic: p.range_note ? [{type: "text", right: 4, bottom: 4, silent: true,
                                style: {text: p.range_note, fontSize: 11, fill: "#555"}}] : [],
      series: [{type: "heatmap", name: p.value_label, data: data, progressive: 0,
                label: {show: cells <= 64, fontSize: 10, formatter: function (it) { return fmt(it.value[2]); }},
                emphasis: {itemStyle: {borderColor: "#000", borderWidth: 1}}}]
    };
  }

  function download(name, url) {
    var a = document.createElement("a");
    a.href = url;
    a.download = name;
    document.body.appendChild(a);
    a.click();
    a.remove();
  }

  function button(text, title, onClick) {
    var b = document.createElement("button");
    b.type = "button";
    b.className = "vs-chart-button";
    b.textContent = text;
    b.title = title;
    b.addEventListener("click", onClick);
    return b;
  }

  var charts = [];
  document.querySelectorAll("figure[data-chart]").forEach(function (fig) {
    var spec = JSON.parse(fig.querySelector("script.vs-chart-data").textContent);
    var stem = fig.getAttribute("data-stem") || "figure";
    var holder = fig.querySelector(".vs-chart-panels");
    spec.panels.forEach(function (p, i) {
      var box = document.createElement("div");
      box.className = "vs-chart-panel";
      var div = document.createElement("div");
      div.className = "vs-chart";
      box.appendChild(div);
      holder.appendChild(box);
      var rows = p.kind === "heatmap" ? 0 : legendRows(p, div.clientWidth || 520);
      div.style.height = (p.kind === "heatmap" ?
        Math.max(260, Math.min(640, 24 * p.rows.length + 100)) + (longLabels(p) ? 90 : 0) : 308 + 22 * rows) + "px";
      var chart = echarts.init(div, null, {renderer: "canvas"});
      try {
        chart.setOption(p.kind === "heatmap" ? heatOption(p, div.clientWidth || 520) : lineOption(p, rows));
      } catch (err) {  // one chart that cannot be drawn leaves the others drawn, and says so
        div.textContent = "This chart could not be drawn (" + err + "); its numbers are in charts/" + stem + ".json.";
        div.style.height = "auto";
        return;
      }
      charts.push(chart);
      var name = spec.panels.length > 1 ? stem + "_" + (i + 1) : stem;
      var tools = document.createElement("div");
      tools.className = "vs-chart-tools";
      if (p.log_toggle) {
        var log = button("log scale", "Switch the value axis between linear and logarithmic", function () {
          var isLog = log.getAttribute("aria-pressed") === "true";
          var axis = chart.getOption().yAxis[0];  // keep its name: a saved PNG or SVG still says what it shows
          chart.setOption({yAxis: {type: isLog ? "value" : "log", name: axis.name, nameLocation: axis.nameLocation,
                                   nameGap: axis.nameGap}});
          log.setAttribute("aria-pressed", isLog ? "false" : "true");
        });
        log.setAttribute("aria-pressed", "false");
        tools.appendChild(log);
      }
      tools.appendChild(button("PNG", "Download this chart as PNG", function () {
        download(name + ".png", chart.getDataURL({type: "png", pixelRatio: 2, backgroundColor: "#fff"}));
      }));
      tools.appendChild(button("SVG", "Download this chart as SVG", function () {
        var off = document.createElement("div");
        off.style.cssText = "position:absolute;left:-10000px;top:0;width:" + div.clientWidth + "px;height:" +
          div.clientHeight + "px";
        document.body.appendChild(off);
        var vector = echarts.init(off, null, {renderer: "svg"});
        vector.setOption(chart.getOption());
        var svg = vector.renderToSVGString();
        vector.dispose();
        off.remove();
        download(name + ".svg", "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svg));
      }));
      box.appendChild(tools);
    });
  });
  window.addEventListener("resize", function () { charts.forEach(function (c) { c.resize(); }); });
})();
