import io.swagger.client.ApiClient;
import io.swagger.client.ApiException;
import io.swagger.client.api.ResortsApi;
import io.swagger.client.api.SkiersApi;
import io.swagger.client.api.StatisticsApi;
import io.swagger.client.model.APIStats;
import io.swagger.client.model.APIStatsEndpointStats;
import io.swagger.client.model.LiftRide;
import io.swagger.client.model.ResortIDSeasonsBody;
import io.swagger.client.model.SkierVertical;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A client of the Ski Data API built only from the code swagger-codegen generates from the spec, the way
 * the course's clients were: threads POST random lift rides (201 expected, up to 5 attempts each, 10 s
 * timeout), then every GET of the spec is asked and checked against what the rides imply.
 *
 * Usage: SpecClient BASE_URL THREADS POSTS_PER_THREAD
 */
public class SpecClient {
    static final String SEASON = "2022";
    static final String DAY = "1";

    static ApiClient client(String base) {
        ApiClient client = new ApiClient();
        client.setBasePath(base);
        client.setConnectTimeout(10_000);
        client.setReadTimeout(10_000);
        return client;
    }

    static void check(boolean ok, String what) {
        if (!ok) {
            throw new IllegalStateException("check failed: " + what);
        }
    }

    public static void main(String[] args) throws Exception {
        String base = args[0];
        int threads = Integer.parseInt(args[1]);
        int postsPerThread = Integer.parseInt(args[2]);
        ConcurrentLinkedQueue<int[]> rides = new ConcurrentLinkedQueue<>();
        AtomicLong failures = new AtomicLong();
        AtomicLong retries = new AtomicLong();
        long started = System.nanoTime();
        List<Thread> workers = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            final int seed = t;
            Thread worker = new Thread(() -> {
                SkiersApi skiers = new SkiersApi(client(base));
                Random random = new Random(seed);
                for (int i = 0; i < postsPerThread; i++) {
                    int resort = 1 + random.nextInt(10);
                    int skier = 1 + random.nextInt(1000);
                    int lift = 1 + random.nextInt(40);
                    int time = 1 + random.nextInt(360);
                    LiftRide ride = new LiftRide();
                    ride.setTime(time);
                    ride.setLiftID(lift);
                    boolean written = false;
                    for (int attempt = 0; attempt < 5 && !written; attempt++) {
                        try {
                            skiers.writeNewLiftRide(ride, resort, SEASON, DAY, skier);
                            written = true;
                        } catch (ApiException e) {
                            retries.incrementAndGet();
                        }
                    }
                    if (written) {
                        rides.add(new int[] {resort, skier, lift, time});
                    } else {
                        failures.incrementAndGet();
                    }
                }
            });
            workers.add(worker);
            worker.start();
        }
        for (Thread worker : workers) {
            worker.join();
        }
        double seconds = (System.nanoTime() - started) / 1e9;
        System.out.printf("%d rides written by %d threads in %.2f s (%.0f/s), %d failed, %d retries%n",
                rides.size(), threads, seconds, rides.size() / seconds, failures.get(), retries.get());
        check(failures.get() == 0, "every POST answered 201");

        Map<List<Integer>, Integer> dayVertical = new HashMap<>();
        Map<Integer, Set<Integer>> resortSkiers = new HashMap<>();
        for (int[] r : rides) {
            dayVertical.merge(Arrays.asList(r[0], r[1]), r[2] * 10, Integer::sum);
            resortSkiers.computeIfAbsent(r[0], k -> new HashSet<>()).add(r[1]);
        }
        ApiClient api = client(base);
        SkiersApi skiers = new SkiersApi(api);
        ResortsApi resorts = new ResortsApi(api);
        // The read model may lag the 201s by a little: wait until one answer is complete.
        int[] last = rides.peek();
        long deadline = System.currentTimeMillis() + 10_000;
        while (true) {
            int expected = resortSkiers.get(last[0]).size();
            int got = resorts.getResortSkiersDay(last[0], Integer.parseInt(SEASON), Integer.parseInt(DAY)).getNumSkiers();
            if (got == expected) {
                break;
            }
            check(System.currentTimeMillis() < deadline, "the read model caught up within 10 s");
            Thread.sleep(20);
        }
        Thread.sleep(200);
        for (Map.Entry<List<Integer>, Integer> e : dayVertical.entrySet()) {
            int resort = e.getKey().get(0);
            int skier = e.getKey().get(1);
            Integer vertical = skiers.getSkierDayVertical(resort, SEASON, DAY, skier);
            check(vertical.equals(e.getValue()), "day vertical of skier " + skier + " at resort " + resort);
            SkierVertical totals = skiers.getSkierResortTotals(skier, Arrays.asList(String.valueOf(resort)), null);
            check(totals.getResorts().size() == 1 && totals.getResorts().get(0).getSeasonID().equals(SEASON)
                    && totals.getResorts().get(0).getTotalVert().equals(e.getValue()),
                    "season totals of skier " + skier + " at resort " + resort);
        }
        for (Map.Entry<Integer, Set<Integer>> e : resortSkiers.entrySet()) {
            int got = resorts.getResortSkiersDay(e.getKey(), Integer.parseInt(SEASON), Integer.parseInt(DAY)).getNumSkiers();
            check(got == e.getValue().size(), "unique skiers at resort " + e.getKey());
        }
        try {
            skiers.getSkierDayVertical(1, SEASON, "2", 1);
            check(false, "a day without rides answers 404");
        } catch (ApiException e) {
            check(e.getCode() == 404, "a day without rides answers 404, got " + e.getCode());
        }
        try {
            skiers.writeNewLiftRide(new LiftRide().time(1).liftID(1), 1, SEASON, "367", 1);
            check(false, "dayID 367 answers 400");
        } catch (ApiException e) {
            check(e.getCode() == 400 && e.getResponseBody().contains("dayID"), "dayID 367 answers 400 naming dayID");
        }
        check(resorts.getResorts().getResorts().size() == 10, "ten resorts");
        ResortIDSeasonsBody season = new ResortIDSeasonsBody();
        season.setYear("2019");
        resorts.addSeason(season, 4);
        List<String> seasons = resorts.getResortSeasons(4).getSeasons();
        check(seasons.contains("2019") && seasons.contains(SEASON), "resort 4's seasons: " + seasons);

        APIStats stats = new StatisticsApi(api).getPerformanceStats();
        boolean postsCounted = false;
        for (APIStatsEndpointStats endpoint : stats.getEndpointStats()) {
            System.out.printf("  %-4s %-70s mean %d ms, max %d ms%n", endpoint.getOperation(), endpoint.getURL(),
                    endpoint.getMean(), endpoint.getMax());
            postsCounted |= endpoint.getOperation().equals("POST") && endpoint.getURL().startsWith("/skiers/")
                    && endpoint.getMax() >= endpoint.getMean();
        }
        check(postsCounted, "statistics report the ride POSTs");
        System.out.printf("all checks passed: %d skier-days, %d resorts%n", dayVertical.size(), resortSkiers.size());
    }
}
